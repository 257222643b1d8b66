#!/usr/bin/env bash
# Fetch, here, the wheels a CUDA machine without network access lacks, into .whl/ (gitignored), for
# tools/gpu_session.sh to install there. That machine has no network; its image already holds
# CuPy, PyTorch, numba, onnx, onnxruntime (CPU build), flatbuffers, matplotlib, tqdm and
# hypothesis, under Python 3.12. What it lacks:
#
#   pyzmq      the KVStore's transport (a mixrt dependency)
#   google-re2 the text operators' regular expressions (a mixrt dependency; compiled)
#   graphviz   mixrt.viz's drawing (the plot extra, which the tests run; pure Python)
#   onnx2torch the zoo models' PyTorch twins, the GPU benchmark's peer where onnxruntime has
#              no CUDA provider (benchmarks only, pure Python)
#
#   tools/gpu_wheels.sh          then copy .whl to that machine with the working tree
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# the project's venv where there is one; pip only downloads, so any Python 3 will do
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
mkdir -p "$root/.whl"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$root/.whl" "pyzmq>=25" "google-re2>=1.1"
"$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$root/.whl" \
    "graphviz>=0.20" "onnx2torch==1.5.15"
ls -l "$root/.whl"
