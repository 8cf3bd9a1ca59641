#!/usr/bin/env python3
"""Turn the files scripts/gpu-check.sh leaves in $OUT into the markdown
tables of a docs/gpu-runs/ record:  python3 scripts/gpu-report.py OUTDIR"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(out: Path) -> None:
    print("## Versions\n\n```\n" + (out / "versions.txt").read_text().strip() + "\n```\n")
    log = (out / "pytest.log").read_text()
    print("## Tests (`pytest -m gpu`)\n")
    for line in log.splitlines():
        m = re.match(r"^tests/gpu/\S+::(\S+) (PASSED|FAILED|XFAIL|XPASS|SKIPPED|ERROR)", line)
        if m:
            print(f"- {m.group(2)} `{m.group(1)}`")
    summary = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    print(f"\n{summary[-1].strip('= ') if summary else 'no summary line'}\n")
    session = json.loads((out / "gpu_session.json").read_text())
    client = {r["name"]: r for r in json.loads((out / "client_results.json").read_text())}
    print("## Per case\n")
    print("build/autotune: the server worker's seconds; ready: the separate client process's fetch + deserialize;")
    print("rel err: worst output, ‖out − ref‖/‖ref‖ against torch in float32.\n")
    print(
        "| case | plans | build s | autotune s | chosen plan | blob B | fetch ms | deserialize ms | ready ms | (build+tune)/ready | rel err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c in session["cases"].items():
        r = client.get(name, {})
        if "error" in c:
            print(f"| {name} | — | — | — | refused: {c['error'][:90]} | | | | | | |")
            continue
        worst = max((o["rel_err"] for o in r.get("outputs", {}).values()), default=float("nan"))
        ratio = (c["build_s"] + c["autotune_s"]) / r["ready_s"] if r.get("ready_s") else float("nan")
        print(
            f"| {name} | {c['candidates']} | {c['build_s']:.2f} | {c['autotune_s']:.2f} | {c['plan_name']} | {c['blob_bytes']:,} | "
            f"{r.get('fetch_s', float('nan')) * 1e3:.1f} | {r.get('deserialize_s', float('nan')) * 1e3:.1f} | {r.get('ready_s', float('nan')) * 1e3:.1f} | {ratio:,.0f}x | {worst:.1e} |"
        )
    print("\n## Autotuned plan vs heuristic plan 0 (client process, CUDA-graph replays, interleaved, median of 5)\n")
    print("| case | autotuned | ms | plan 0 | ms | plan0/tuned |")
    print("|---|---|---|---|---|---|")
    for name, r in client.items():
        if "tuned_ms" in r:
            print(
                f"| {name} | {r['tuned_name']} | {r['tuned_ms']:.4f} | {r['plan0_name']} | {r['plan0_ms']:.4f} | {r['plan0_ms'] / r['tuned_ms']:.2f} |"
            )
    cold = session.get("cold", {})
    if cold:
        print("\n## Walkthrough graphs, each fetched by its own fresh client process\n")
        print(
            "handle set-up: cudnn handle (+ cuBLASLt load where the client does it), before the request; excluded from ready.\n"
        )
        print(
            "| case | server build+autotune s | handle set-up ms | fetch ms | first deserialize ms | deserialize again ms | ready ms | ratio |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, r in cold.items():
            c = session["cases"][name]
            build = c["build_s"] + c["autotune_s"]
            setup = r.get("handle_setup_s", float("nan")) * 1e3
            print(
                f"| {name} | {build:.2f} | {setup:.0f} | {r['fetch_s'] * 1e3:.1f} | {r['deserialize_s'] * 1e3:.1f} | {r.get('deserialize_again_s', float('nan')) * 1e3:.1f} | {r['ready_s'] * 1e3:.1f} | {build / r['ready_s']:,.0f}x |"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
