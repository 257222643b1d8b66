"""Image operators: Resize, GridSample, AffineGrid, NonMaxSuppression, ImageDecoder, with
their gradients and compiled kernels.
"""
