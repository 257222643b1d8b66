"""Elementwise math: unary and binary ops, comparisons, activations, casts, the fused
elementwise chains and their compiled loops, with their gradients.
"""
