#!/usr/bin/env bash
# On a 2-GPU machine: install the carried wheels (see gpu-check.sh) and
# measure compile throughput with one worker vs two (bench/multi_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
# shellcheck source=scripts/gpu-env.sh
source scripts/gpu-env.sh
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 bench/multi_gpu.py --out "$OUT" 2>&1 | tee "$OUT/multi-gpu.log"
(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
