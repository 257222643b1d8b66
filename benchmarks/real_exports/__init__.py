"""Models as today's exporters write them, built from the exporters' own packages with seeded
random weights (nothing downloaded), for ``benchmarks/real_exports_bench.py``.

One module per source: ``hf`` (Hugging Face transformers through both PyTorch exporters),
``vision`` (torchvision classification, segmentation, detection), ``quantized``
(onnxruntime's quantizers and transformer optimizer, a float16 conversion), ``classical``
(scikit-learn, LightGBM, XGBoost through skl2onnx/onnxmltools). Each exposes ``BUILDERS``: name
-> a function that writes the model and its feeds (``common.Built``).
"""
