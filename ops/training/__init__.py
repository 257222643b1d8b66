"""The ``ai.onnx.preview.training`` optimizer operators and the backward-only kernels many
gradients share.
"""
