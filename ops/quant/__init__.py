"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, the QLinear and
integer products, onnxruntime's quantized operators (``com.microsoft``), and the 8-bit
products on AVX-512 VNNI.
"""
