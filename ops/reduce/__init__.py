"""Reductions over axes (ReduceSum, ReduceMax, ...) and running scans, with their gradients.
"""
