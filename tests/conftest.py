import sys
from pathlib import Path

# mixrt before anything loads NumPy, whichever test file pytest collects first: its BLAS
# policy (runtime/blas_policy.py) then sets OpenBLAS's environment instead of restarting it
import mixrt  # noqa: E402,F401


sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers.py
