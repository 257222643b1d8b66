"""ONNX backend conformance: every case of onnx's backend test suite, on CPU and (where a
CUDA GPU is usable) on the GPU. Cases in expected_failures.txt are expected failures; the
CUDA cases skip with "Backend doesn't support device CUDA" where there is no GPU."""

from conformance_suite import backend_test

globals().update(backend_test(__name__).test_cases)
