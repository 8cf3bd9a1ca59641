"""plancache's RFC 8785 encoder (plancache.graphspec.jcs, as it is at the commit
measured) against the `rfc8785` package, on the canonical structure of every spec
the repository ships (tests/support/specs.py and examples/*.json), and the weight of
that encoding on a compile() hit (issue 40, docs/design.md "Libraries"). Until issue
40 the encoder was hand-written (bench/results/jcs_bench_handwritten.json); since,
it is `rfc8785` with the 2**53 domain widened (bench/results/jcs_bench.json).

For each spec: the bytes of both (they must be identical), then the time per
encoding of each, interleaved rounds in one process, median over the rounds.
Then the whole client-side hit path: Client.compile() answered from the disk
cache (no network: the cheapest hit, where hashing weighs most), and the key
derivation alone (validate, normalize, canonicalize, hash).

    python bench/jcs_bench.py [--quick] [--out DIR]    # writes DIR/jcs_bench.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rfc8785

from bench.report import per_call_us, write_json
from plancache import Client, DiskCache, GraphSpec, Plan
from plancache.graphspec.canonical import canonical_dict
from plancache.graphspec.jcs import canonicalize
from plancache.graphspec.spec_io import from_json
from plancache.graphspec.validation import normalize
from plancache.keys.query import PlanQuery
from plancache_server.worker.verified_job import VerifiedJob, plan_metadata
from tests.support import specs
from tests.support.processes import REPO
from tests.support.standin import STANDIN_TARGET, StandInCompiler


def repo_specs() -> dict[str, GraphSpec]:
    found = {"matmul_spec": specs.matmul_spec(), "matmul_bias_relu_spec": specs.matmul_bias_relu_spec()}
    for path in sorted((REPO / "examples").glob("*.json")):
        found[path.stem] = from_json(path.read_text())
    return found


def encoders(structures: dict[str, Any], rounds: int, inner: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, value in structures.items():
        ours = canonicalize(value)  # whatever plancache.graphspec.jcs is at this commit
        try:
            theirs: bytes | str = rfc8785.dumps(value)
        except rfc8785.CanonicalizationError as e:
            theirs = f"refused: {e}"
        times: dict[str, list[float]] = {"plancache": [], "rfc8785": []}
        for _ in range(rounds):  # interleaved: the machine is shared and noisy
            times["plancache"].append(per_call_us(lambda v=value: canonicalize(v), inner))
            times["rfc8785"].append(per_call_us(lambda v=value: rfc8785.dumps(v), inner))
        rows[name] = {
            "bytes": len(ours),
            "identical": ours == theirs,
            "plancache_us": statistics.median(times["plancache"]),
            "rfc8785_us": statistics.median(times["rfc8785"]),
        }
    return rows


def hit_path(spec: GraphSpec, rounds: int, inner: int) -> dict[str, float]:
    """compile() answered from the disk cache, and the key derivation alone, for one spec."""
    query = PlanQuery.of(spec, STANDIN_TARGET)
    with tempfile.TemporaryDirectory(prefix="plancache-jcs-bench-") as tmp:
        cache = DiskCache(Path(tmp))
        compiled = StandInCompiler().compile(query)
        cache.put(Plan(compiled.blob, plan_metadata(VerifiedJob(query), compiled, "bench", STANDIN_TARGET.to_proto())))
        # The channel is never used: every compile() is a disk cache hit.
        with Client("127.0.0.1:9", cache=cache, allow_unsigned=True, hedge=False, report=False) as client:
            assert client.compile(spec, STANDIN_TARGET).key == query.key
            compile_us = statistics.median(
                per_call_us(lambda: client.compile(spec, STANDIN_TARGET), inner) for _ in range(rounds)
            )
        key_us = statistics.median(
            per_call_us(lambda: PlanQuery.of(spec, STANDIN_TARGET).key, inner) for _ in range(rounds)
        )
    value = canonical_dict(normalize(spec))
    return {
        "compile_disk_cache_hit_us": compile_us,
        "key_derivation_us": key_us,
        "plancache_us": statistics.median(per_call_us(lambda: canonicalize(value), inner) for _ in range(rounds)),
        "rfc8785_us": statistics.median(per_call_us(lambda: rfc8785.dumps(value), inner) for _ in range(rounds)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="a short run (the smoke test)")
    args = parser.parse_args()
    rounds, inner = (3, 20) if args.quick else (15, 200)
    found = repo_specs()
    structures = {name: canonical_dict(normalize(spec)) for name, spec in found.items()}
    rows = encoders(structures, rounds, inner)
    ratios = [r["rfc8785_us"] / r["plancache_us"] for r in rows.values()]
    results = {
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "machine": {"python": sys.version.split()[0], "rfc8785": importlib.metadata.version("rfc8785")},
        "rounds": rounds,
        "inner": inner,
        "specs": rows,
        "all_identical": all(r["identical"] for r in rows.values()),
        "rfc8785_over_ours": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "hit_path": {"matmul_spec": hit_path(found["matmul_spec"], rounds, inner)},
    }
    print(f"{'spec':<34} {'bytes':>6} {'plancache us':>12} {'rfc8785 us':>10} {'ratio':>6} same")
    for name, r in rows.items():
        print(
            f"{name:<34} {r['bytes']:>6} {r['plancache_us']:>12.1f} {r['rfc8785_us']:>10.1f} "
            f"{r['rfc8785_us'] / r['plancache_us']:>6.2f} {r['identical']}"
        )
    hit = results["hit_path"]["matmul_spec"]
    print(json.dumps(results["rfc8785_over_ours"]), json.dumps(hit))
    write_json(args.out / "jcs_bench.json", results)


if __name__ == "__main__":
    main()
