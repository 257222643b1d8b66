"""Pooling: MaxPool, AveragePool, LpPool, their global forms, MaxUnpool, MaxRoiPool, RoiAlign
and LRN, with their CPU paths and compiled kernels.
"""
