#!/usr/bin/env bash
# Extracts the cuDNN frontend's own Python tests (test/python) and sample
# notebooks (samples/python, converted to scripts) into .frontend-suite/
# (git-ignored, about 1 MB), for scripts/frontend-suite.sh to run on a GPU
# machine (carry .frontend-suite with .whl).
#
#   scripts/fetch-frontend-tests.sh [SRC [REV]]
#
# SRC: a git dir (a bare mirror; default /work/.mirror/NVIDIA+cudnn-frontend/repo
# when it exists) read at REV (default HEAD), or a checkout / copy of the
# sources, taken as it is. Left out: test/python/fe_api (CuTe-DSL APIs: they
# need nvidia-cutlass-dsl, which the GPU machine does not have).
# .frontend-suite/SOURCE records where the tests came from.
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=/work/.mirror/NVIDIA+cudnn-frontend/repo
SRC=${1:-}
if [ -z "$SRC" ]; then
  [ -d "$MIRROR" ] || { echo "usage: $0 SRC [REV]  (SRC: a git dir or a checkout of NVIDIA/cudnn-frontend)" >&2; exit 2; }
  SRC=$MIRROR
fi
REV=${2:-HEAD}
DEST=.frontend-suite
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ -d "$SRC/test/python" ]; then
  mkdir -p "$TMP/test" "$TMP/samples" "$TMP/python/cudnn"
  cp -r "$SRC/test/python" "$TMP/test/python"
  if [ -d "$SRC/samples/python" ]; then cp -r "$SRC/samples/python" "$TMP/samples/python"; fi
  if [ -f "$SRC/python/cudnn/__init__.py" ]; then cp "$SRC/python/cudnn/__init__.py" "$TMP/python/cudnn/"; fi
  COMMIT=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)")
  DATE=$(git -C "$SRC" log -1 --format=%cI 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$SRC" status --porcelain -- test/python samples/python 2>/dev/null)" ]; then COMMIT="$COMMIT (with local changes)"; fi
elif COMMIT=$(git --git-dir="$SRC" rev-parse --verify -q "$REV^{commit}"); then
  DATE=$(git --git-dir="$SRC" log -1 --format=%cI "$COMMIT")
  git --git-dir="$SRC" archive "$COMMIT" test/python samples/python python/cudnn/__init__.py | tar -x -C "$TMP"
else
  echo "$SRC: neither a checkout with test/python nor a git dir with $REV" >&2
  exit 2
fi

rm -rf "$DEST"
mkdir -p "$DEST/test"
cp -r "$TMP/test/python" "$DEST/test/python"
rm -rf "$DEST/test/python/fe_api"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$DEST/samples"
if [ -d "$TMP/samples/python" ]; then
  python3 scripts/frontend_suite.py --convert-notebooks "$TMP/samples/python" "$DEST/samples"
fi
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$TMP/python/cudnn/__init__.py" 2>/dev/null || true)
cat > "$DEST/SOURCE" <<EOF
repository: NVIDIA/cudnn-frontend
source: $SRC
commit: $COMMIT
commit date: $DATE
frontend version of these tests: ${VERSION:-unknown}
extracted: $(date -u +%Y-%m-%dT%H:%M:%SZ)
left out: test/python/fe_api (CuTe-DSL APIs, need nvidia-cutlass-dsl)
EOF
echo "$DEST: $(find "$DEST/test/python" -name 'test_*.py' | wc -l) test files, $(find "$DEST/samples" -name '*.py' | wc -l) samples, $(du -sh "$DEST" | cut -f1)"
cat "$DEST/SOURCE"
