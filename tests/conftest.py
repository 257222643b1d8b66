import sys
from pathlib import Path

# mixrt before anything loads NumPy, whichever test file pytest collects first: its BLAS
# policy (mixrt/__init__.py) acts only then, and otherwise every run would warn about it
import mixrt  # noqa: E402,F401


sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers.py
