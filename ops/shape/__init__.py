"""Shape, layout and index operators: ops that create, reshape, join, split, move, gather and
scatter tensors without arithmetic, with their gradients.
"""
