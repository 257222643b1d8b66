"""The traditional-ML operators of ``ai.onnx.ml`` (linear models, SVMs, tree ensembles, maps,
scalers, encoders) and mixrt's PairwiseSquaredDistances, with their compiled kernels.
"""
