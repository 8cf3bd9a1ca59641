"""Row 2 of the CPU benchmark, run as a fresh process: time from a plan key
to verified bytes from the client's disk cache (no server involved).

    python bench/cache_reader.py CACHE_DIR KEYS_FILE  -> one JSON line
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

started = time.perf_counter()
from plancache.trust.disk_cache import DiskCache  # noqa: E402 - the import is part of what a fresh process pays

imported = time.perf_counter()


def main() -> None:
    cache = DiskCache(Path(sys.argv[1]))
    keys = json.loads(Path(sys.argv[2]).read_text())
    per_plan = []
    for key in keys:
        t0 = time.perf_counter()
        plan = cache.get(key)
        per_plan.append(time.perf_counter() - t0)
        assert plan is not None, key
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "first_ms": per_plan[0] * 1e3,
                "median_ms": statistics.median(per_plan) * 1e3,
                "max_ms": max(per_plan) * 1e3,
                "plans": len(keys),
            }
        )
    )


if __name__ == "__main__":
    main()
