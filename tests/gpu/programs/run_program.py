"""Run a frontend program unchanged and report how plancache.cudnn built
its graphs: `python -m tests.gpu.programs.run_program PROGRAM REPORT.json`.

The program runs as __main__ (runpy), with logging on stderr (plancache at
INFO and up, so a fallback's one line shows); then the graphs it built
(name, plan key and source, or why locally; the captured spec) and the
shim's counters are written to REPORT.json for the test to read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import runpy
import sys
from pathlib import Path

import plancache
import plancache.cudnn


def main() -> None:
    program, report = Path(sys.argv[1]), Path(sys.argv[2])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("plancache").setLevel(logging.INFO)
    runpy.run_path(str(program), run_name="__main__")
    stats = plancache.cudnn.stats()
    graphs = [
        {
            "name": b.name,
            "source": b.source,
            "key": b.plan.key if b.plan else b.key,  # a hedged miss its own build won: the key it asked for
            "reason": b.reason,
            "spec": b.spec.to_json() if b.spec else None,
        }
        for b in plancache.cudnn.graphs()
    ]
    races = dataclasses.asdict(plancache.race_stats()["cudnn"])
    report.write_text(
        json.dumps(
            {"served": stats.served, "local": stats.local, "reasons": stats.reasons, "graphs": graphs, "races": races},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
