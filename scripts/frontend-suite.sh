#!/usr/bin/env bash
# The cuDNN frontend's own tests (and samples), natively and with one line
# changed (`import plancache.cudnn as cudnn`) against a live plancache-server,
# in one call on a GPU machine: scripts/frontend_suite.py says how.
#
#   OUT=/some/dir scripts/frontend-suite.sh [frontend_suite.py arguments]
#     (none)                        the default test files, phases native,plancache,again (~8 minutes at most)
#     --tests --samples             the 24 sample notebooks instead (as scripts)
#     --tests test_conv_bias -k fp16 --time-limit 120
#
# Carry .whl/ (scripts/fetch-gpu-wheels.sh: the frontend, looseversion ...) and
# .frontend-suite/ (scripts/fetch-frontend-tests.sh). What comes back in $OUT:
# frontend-suite.{json,md}, {plancache,again}-graphs.json, versions.txt and
# logs.tgz (pytest logs, junit XML, events, the server's log, each sample's log).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/logs"
if [ ! -f .frontend-suite/test/python/conftest.py ]; then
  echo ".frontend-suite/ missing: run scripts/fetch-frontend-tests.sh and carry .frontend-suite" >&2
  exit 2
fi
# shellcheck source=scripts/gpu-env.sh
source scripts/gpu-env.sh

python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, torch, cudnn, pytest
print("python", platform.python_version(), "pytest", pytest.__version__)
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name(0), "cc", torch.cuda.get_device_capability(0))
print("cudnn backend", cudnn.backend_version(), "frontend", cudnn.__version__)
try:
    import looseversion
    print("looseversion", getattr(looseversion, "__version__", "present"))
except ImportError:
    print("looseversion MISSING: most frontend tests will fail to import (add it to .whl with scripts/fetch-gpu-wheels.sh)")
PY
cat "$OUT/versions.txt"
grep -h "^commit\|^frontend version" .frontend-suite/SOURCE

python3 scripts/frontend_suite.py --out "$OUT" --logs "$OUT/logs" "$@" 2>&1 | tee "$OUT/logs/frontend-suite.log"
status=${PIPESTATUS[0]}
# At most 8 files come back from the device: everything but the reports travels as one archive.
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
exit "$status"
