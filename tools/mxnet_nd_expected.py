"""Regenerates tests/mxnet_nd_expected.py: runs tests/mxnet_nd_cases.py's cases on real
MXNet 1.9.1 and writes what each gives (shape, dtype and values, a Python value, or the
error's type). Run it with MXNet's Python, never mixrt's:

    /path/to/mxnet-venv/bin/python tools/mxnet_nd_expected.py
"""

import pprint
import re
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import mxnet_nd_cases  # noqa: E402


def described(value):
    if isinstance(value, mx.nd.NDArray):
        return {"shape": tuple(value.shape), "dtype": np.dtype(value.dtype).name,
                "values": value.asnumpy().tolist()}
    if isinstance(value, (list, tuple)):
        return [described(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


def run(case):
    try:
        return described(case(mx.nd, mx.autograd))
    except Exception as exc:  # noqa: BLE001  (the error's type is the expectation)
        return {"error": type(exc).__name__}


def main() -> None:
    expected = {name: run(case) for name, case in mxnet_nd_cases.CASES.items()}
    text = pprint.pformat(expected, width=96, sort_dicts=True)
    text = re.sub(r"\bnan\b", "NAN", re.sub(r"\binf\b", "INF", text))
    (ROOT / "tests" / "mxnet_nd_expected.py").write_text(
        '"""What real MXNet 1.9.1 gave for tests/mxnet_nd_cases.py (written by '
        'tools/mxnet_nd_expected.py)."""\n\nNAN, INF = float("nan"), float("inf")\n\n'
        f"EXPECTED = {text}\n")


if __name__ == "__main__":
    main()
