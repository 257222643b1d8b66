#!/usr/bin/env bash
# What to run on a CUDA machine without network access, from the repository root there, so
# that the time on the machine goes to measuring rather than setting up. Each step takes at
# most 10 minutes; logs and results go to $OUT (default /tmp/mixrt-gpu-out).
#
# Here, first:   tools/gpu_wheels.sh          (fills .whl/, to copy there with the tree)
# There:         bash tools/gpu_session.sh tests    the GPU test files and the ONNX backend
#                                                   suite's _cuda cases, with the real CuPy
#                bash tools/gpu_session.sh bench    run_all --gpu-only (its block of
#                                                   BENCHMARKS.md) and train_bench on the GPU
#                bash tools/gpu_session.sh train    train_bench on the GPU alone: the MLP,
#                                                   ResNet-18 and ResNet-50, float32 (exact
#                                                   in both), tf32 and float16, mixrt's steps
#                                                   replayed as CUDA graphs (args go to
#                                                   train_bench.py)
#                bash tools/gpu_session.sh profile  benchmarks/profile_gpu.py: GPU time per op
#                                                   (--kernels: per kernel; --host: cProfile)
#
# A command there is then, for example:
#   bash tools/gpu_session.sh tests 2>&1 | tee $OUT/tests.log
# Extra arguments after the step go to pytest (tests), run_all.py (bench) or
# profile_gpu.py (profile).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
out="${OUT:-/tmp/mixrt-gpu-out}"
mkdir -p "$out"
step="${1:-}"
shift || true

setup() {
    # the machine's image has everything else (tools/gpu_wheels.sh says what and why)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "no wheels in .whl: run tools/gpu_wheels.sh here and carry .whl"; exit 2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
    export MIXRT_CACHE_DIR=/tmp/mixrt-cache PYTHONUNBUFFERED=1
    python3 - <<'EOF' || exit 2
import cupy, torch, onnxruntime, mixrt
from mixrt.ops.device import gpu_available
print("GPU:", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
      "| cupy", cupy.__version__, "| torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "| onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers(),
      "| mixrt sees a GPU:", gpu_available())
EOF
}

# The files whose GPU cases are not marked ``gpu`` (refusals, device errors, traces): they run
# whole, after the marked tests of every other file (tests/conftest.py gives the mark).
GPU_EXTRA_FILES=(tests/test_session.py tests/test_profiler_api.py tests/gluon/test_hybrid_errors.py)

case "$step" in
    tests)
        # budgets that fit one device call (10 minutes) with the setup: the marked tests and the
        # backend suite spread over the host's cores (the image has pytest-xdist), a hung test
        # stopped by pytest-timeout (the image has it too) instead of eating the call
        setup
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -n 6 --timeout 150 \
            --junitxml="$out/gpu_marked.xml" tests --ignore=tests/conformance -m gpu "$@" \
            > "$out/gpu_marked.log" 2>&1
        echo "GPU tests (-m gpu): exit $?"; tail -n 40 "$out/gpu_marked.log"
        timeout 90 python3 -m pytest -q -rs -p no:cacheprovider -n 3 --timeout 60 \
            --junitxml="$out/gpu_files.xml" "${GPU_EXTRA_FILES[@]}" "$@" > "$out/gpu_files.log" 2>&1
        echo "GPU test files: exit $?"; tail -n 15 "$out/gpu_files.log"
        # ~4,000 cases, many compiling a CuPy kernel on first use
        timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 --timeout 60 \
            --junitxml="$out/cuda_conformance.xml" tests/conformance -k cuda "$@" \
            > "$out/cuda_conformance.log" 2>&1
        echo "backend suite, _cuda cases: exit $?"; tail -n 5 "$out/cuda_conformance.log"
        ;;
    bench)
        setup
        cp BENCHMARKS.md "$out/BENCHMARKS.md"
        timeout 330 python3 benchmarks/run_all.py --gpu-only --out "$out/BENCHMARKS.md" "$@"
        echo "run_all --gpu-only: exit $?"
        timeout 200 python3 benchmarks/train_bench.py --device gpu --models mlp resnet18 \
            resnet50 --precision float32 tf32 float16 \
            --out "$out/train_gpu.md"
        echo "train_bench --device gpu: exit $?"
        ;;
    train)
        setup
        timeout 540 python3 benchmarks/train_bench.py --device gpu \
            --models mlp resnet18 resnet50 --precision float32 tf32 float16 \
            --out "$out/train_gpu.md" "$@"
        echo "train_bench --device gpu: exit $?"
        ;;
    profile)
        # where the GPU time goes per op type (benchmarks/profile_gpu.py; args go to it)
        setup
        timeout 300 python3 benchmarks/profile_gpu.py "$@"
        echo "profile_gpu: exit $?"
        ;;
    *)
        echo "usage: bash tools/gpu_session.sh tests|bench|train|profile [args]" >&2
        exit 2
        ;;
esac
