#!/usr/bin/env bash
# Issue 41's drop-in hedged miss on a GPU machine, one call: where its excess over the program's own build goes.
# Arms, each `bench/startup.py --study hedge-paired` (warm JIT cache, shared CPUs), results under $OUT/<arm>/:
#   pairs     the hedged drop-in program right after its local program, and the same with its fresh worker holding
#             autotuning back while misses come (first-dropin+quiet+hedge: --tune-after-quiet 1), the two pairs
#             alternating, REPEATS times each
#   paused    --pause-worker (nothing of the service's builds runs while the node does: a diagnosis), REPEATS pairs
#   owncache  the pairs of $PAIRS with each first node's worker on a copy of the warm JIT cache (--worker-own-jit-cache:
#             whether the CUDA JIT cache node and service share on one host slows the node's own builds)
#   profile   one pair under cProfile (PLANCACHE_BENCH_PROFILE, every thread): its profiles in rest.tgz
#   shared    the pairs of $PAIRS (default first-dropin) as shipped, every process on every CPU
#   cores     the same with node and service on different physical cores (--split-cpus)
#   pool1     the same with the worker building in one process (--build-processes 1: less of the host's CPU)
#   gpu1      the same with the worker on GPU 1, the nodes on GPU 0 (--worker-device 1; a 2-GPU machine)
#   gcfreeze  the pairs of $PAIRS with every node's set-up objects frozen out of the garbage collector before its
#             clock (gc.freeze(), both sides): whether full collections in the first graphs are the gap (each
#             node's JSON has its collections, `gc`, in every arm)
#   pinned    the pairs of $PAIRS with every node process (both sides) pinned to $NODE_CPUS (default: the two CPUs
#             bench/cpu_speed_map.py finds fastest, its map in $OUT/cpu_speed_map.json), the service on all CPUs
#             (GPU run 44: its hosts' two paces were the time's, not a CPU's: pinned pairs were no steadier)
#   (shared, cores, pool1 and gpu1 together: which of the service's work beside a hedged node slows its own build,
#   GPU run 40: the CPUs' cores, the CPU time or the GPU)
# PAIRS: bench/startup.py's --pairs names (its --help lists them): first-compile, first-dropin, first-compile-4proc,
# first-lazy, first-functional (the decode step), first-functional-train (a training step: local-functional-train,
# then first-functional-train+hedge), and the diagnoses first-dropin+quiet, first-compile+eager, first-dropin+eager,
# first-dropin+no-stream, local-program+imported.
# PAIRS=first-dropin,local-program+imported adds, before each drop-in pair, the local program with the drop-in's
# imports loaded and unused (bench/startup.py IMPORTED: whether they slow its first graph's build, GPU run 46).
# JIT=cold runs every arm with an empty JIT cache (CUDA_CACHE_DISABLE=1, nodes and worker) instead of a warm one.
# BENCH_BESIDE_GPU=1 also samples the GPU's utilization beside each hedged node (nvidia-smi every 50 ms; off by
# default: the single local runs have no sampler beside them, so it weighs on the hedged side of each pair).
# Usage (after `source scripts/gpu-env.sh`): REPEATS=4 ARMS="pairs paused profile" scripts/gpu-dropin-hedge.sh
#   python3 bench/cpu_speed_map.py --out "$OUT/cpu_speed_map"; ARMS="shared pinned" scripts/gpu-dropin-hedge.sh
#   PAIRS=first-dropin,first-compile REPEATS=3 ARMS="shared cores pool1 gpu1" scripts/gpu-dropin-hedge.sh
#   PAIRS=first-functional-train REPEATS=4 TIME_LIMIT=300 ARMS=shared scripts/gpu-dropin-hedge.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
for arm in ${ARMS:-pairs paused profile}; do
  mkdir -p "$OUT/$arm"
  pairs=first-dropin pause="" profile="" repeats=${REPEATS:-4} flags=()
  case "$arm" in
    pairs) pairs=first-dropin,first-dropin+quiet ;;
    paused) pause=1 pairs=${PAIRS:-first-dropin} ;;
    owncache) pairs=${PAIRS:-first-dropin} flags=(--worker-own-jit-cache) ;;
    profile) profile=1 repeats=1 ;;
    shared) pairs=${PAIRS:-first-dropin} ;;
    cores) pairs=${PAIRS:-first-dropin} flags=(--split-cpus) ;;
    pool1) pairs=${PAIRS:-first-dropin} flags=(--build-processes 1) ;;
    gpu1) pairs=${PAIRS:-first-dropin} flags=(--worker-device 1) ;;
    gcfreeze) pairs=${PAIRS:-first-dropin} ;;
    pinned)
      pairs=${PAIRS:-first-dropin}
      [ -f "$OUT/cpu_speed_map.json" ] || python3 bench/cpu_speed_map.py --out "$OUT/cpu_speed_map" > "$OUT/cpu_speed_map.log" 2>&1
      cpus=${NODE_CPUS:-$(python3 -c "import json, statistics, sys; ms = json.load(open(sys.argv[1]))['ms']; \
print(','.join(sorted(ms, key=lambda c: statistics.median(ms[c]))[:2]))" "$OUT/cpu_speed_map.json")}
      echo "pinned: node processes on CPUs $cpus"
      flags=(--node-cpus "$cpus") ;;
    *) echo "unknown arm $arm" >&2; continue ;;
  esac
  BENCH_MISS_PHASES=1 BENCH_MISS_PROFILE="$profile" BENCH_NODE_GC_FREEZE=$([ "$arm" = gcfreeze ] && echo 1) \
    python3 bench/startup.py --out "$OUT/$arm" --jit "${JIT:-warm}" --study hedge-paired --pairs "$pairs" \
      --warm-cache .startup-jit-cache --time-limit "${TIME_LIMIT:-200}" --repeats "$repeats" \
      ${pause:+--pause-worker} "${flags[@]}" > "$OUT/$arm/startup.log" 2>&1
  grep -A14 "JIT cache  path" "$OUT/$arm/startup.log" | head -14
  # At most 8 files come back: per arm its JSON and one archive of the rest (written beside the folder, then moved in).
  (cd "$OUT/$arm" && tar czf "../$arm-rest.tgz" --exclude=startup.json . \
    && find . -mindepth 1 ! -name startup.json -exec rm -rf {} + && mv "../$arm-rest.tgz" rest.tgz)
done
