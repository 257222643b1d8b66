"""Neural-network layers: matrix products (MatMul, Gemm and the fused products), the softmax
family, dropout, the normalizations and the losses, with their gradients and CPU paths.
"""
