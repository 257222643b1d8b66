"""Attention: ONNX's Attention family, the recurrent-state relatives, mixrt's FusedAttention,
and onnxruntime's fused transformer operators (``com.microsoft``), with their gradients.
"""
