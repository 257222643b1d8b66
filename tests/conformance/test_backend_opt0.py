"""The ONNX backend conformance cases again at opt_level 0 (no graph passes), so an
optimization can never hide a kernel bug, nor a kernel bug hide behind a pass."""

from conformance_suite import UnoptimizedBackend, backend_test

globals().update(backend_test(__name__, backend=UnoptimizedBackend).test_cases)
