"""The main job until training lands: run the 9 zoo models end to end and check them.

Each model is loaded from its ONNX file, bound to kernels, run on its reference input, and
compared with the reference output onnx ships beside it.
"""

from __future__ import annotations

import time

import numpy as np

from mixrt.runtime.session import Session


def run_demo(device: str = "cpu", rtol: float = 1e-3, atol: float = 1e-5) -> int:
    from mixrt.models.zoo import LIGHT_MODELS, light_model  # noqa: PLC0415 (onnx)

    print(f"mixrt demo: {len(LIGHT_MODELS)} ImageNet architectures on {device}")
    print(f"{'model':14} {'load ms':>8} {'run ms':>8} {'max abs err':>12}  result")
    failures = 0
    for name in LIGHT_MODELS:
        zoo = light_model(name)
        started = time.perf_counter()
        session = Session(str(zoo.path), device=device)
        loaded = time.perf_counter()
        outputs = session.run(None, zoo.inputs)
        ran = time.perf_counter()
        errors = [float(np.max(np.abs(o.astype(np.float64) - e))) for o, e in
                  zip(outputs, zoo.expected)]
        ok = all(np.allclose(o, e, rtol=rtol, atol=atol) for o, e in zip(outputs, zoo.expected))
        failures += not ok
        print(f"{name:14} {(loaded - started) * 1e3:8.0f} {(ran - loaded) * 1e3:8.0f} "
              f"{max(errors):12.2e}  {'matches reference' if ok else 'MISMATCH'}", flush=True)
    print(f"{len(LIGHT_MODELS) - failures} of {len(LIGHT_MODELS)} models match their "
          f"reference outputs (rtol={rtol}, atol={atol})")
    return 1 if failures else 0
