"""Image operators: Resize, GridSample, AffineGrid, NonMaxSuppression, ImageScaler,
ImageDecoder, with their gradients and compiled kernels.
"""
