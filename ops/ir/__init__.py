"""The operators' share of the IR, below every family: the registry that ops register into,
the value types and the inference rules most ops share, ONNX's element types, and the
per-node state a kernel prepares once.
"""
