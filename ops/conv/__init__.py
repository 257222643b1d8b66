"""Convolutions: Conv, ConvTranspose, DeformConv and Col2Im, their gradients, and their CPU
paths (im2col, direct, Winograd, grouped, depthwise) with their compiled kernels.
"""
