import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # lets test_backend.py import conformance_suite.py
