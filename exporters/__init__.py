"""ONNX export and coverage validation (training issue)."""
