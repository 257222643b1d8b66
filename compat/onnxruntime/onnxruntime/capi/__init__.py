"""``onnxruntime.capi``: the modules onnxruntime's Python code imports its classes from."""
