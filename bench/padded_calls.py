"""What a row count padded to its auto bucket costs the host, per call, on the CPU (issues 42 and 43).

Since rows are bucketed by default once they vary (plancache.frontdoors.buckets.AUTO), a layer's new row
counts run at their bucket's geometry: zero rows appended, the bucket's plan, the caller's rows sliced back.
A padded row count has no table entry of its own, so every call of it passes the table's miss path. What
that costs over a call of the bucket's own size, measured here on tiny CPU tensors taken as if on the GPU
(each geometry's entry runs torch's function, a stand-in for its served plan, as
tests/unit/functional/test_buckets.py does), interleaved rounds of --calls calls, µs per call, medians:

  torch             F.linear on the caller's rows: what the program pays without plancache
  exact             plancache.functional.linear at a row count it met before (its own geometry)
  bucket            plancache.functional.linear at a bucket's own row count (16)
  padded            at a padded row count (13 -> 16): the decided bucket taken at once (AUTO.pad_known)
  padded_bookkept   the same with every call deciding again (the layer's bookkeeping: before pad_known)

    python3 bench/padded_calls.py --out DIR     # DIR/padded_calls.{json,png}
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import bar_chart, per_call_us, table, write_json  # noqa: E402

ARMS = ("torch", "exact", "bucket", "padded", "padded_bookkept")


def measure(rounds: int, calls: int) -> dict[str, list[float]]:
    import torch

    import plancache.functional as pf
    from plancache.frontdoors import buckets
    from plancache.functional import _first_call, _linear
    from plancache.functional._table import TABLE, Fallback
    from tests.support.frontdoor_standins import TARGET, StandInClient

    # STAND-IN (as in tests/unit/functional/test_buckets.py): CPU tensors taken as if on the GPU; each
    # geometry's first call leaves an entry running torch's function where a served plan would be.
    buckets.on_gpu = lambda x: True  # type: ignore[assignment]

    def first_call(bound: Any, key: Any, request: Any, fallback: Any, *args: Any) -> Any:
        entry = Fallback(bound.function, key, fallback, "the benchmark's stand-in", transient=True)
        TABLE.put(key, entry)
        return entry(bound.tensors)

    _linear.first_call = first_call  # type: ignore[assignment]
    _first_call._once.forget()
    pf.configure(StandInClient(), target=TARGET)
    pf.set_auto_buckets(True)
    torch.manual_seed(0)
    weight, bias = torch.randn(8, 16, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    for rows in (5, 9, 11):  # the layer's rows vary: from the third, new row counts are padded
        pf.linear(torch.randn(rows, 16, dtype=torch.float64), weight, bias)
    exact, bucket, padded = (torch.randn(rows, 16, dtype=torch.float64) for rows in (9, 16, 13))
    pf.linear(padded, weight, bias)  # its bucket decided
    known = buckets.AUTO.pad_known

    def bookkept() -> Any:
        buckets.AUTO.pad_known = lambda key, x: None  # type: ignore[method-assign]
        try:
            return pf.linear(padded, weight, bias)
        finally:
            buckets.AUTO.pad_known = known  # type: ignore[method-assign]

    arms: dict[str, Callable[[], Any]] = {
        "torch": lambda: torch.nn.functional.linear(padded, weight, bias),
        "exact": lambda: pf.linear(exact, weight, bias),
        "bucket": lambda: pf.linear(bucket, weight, bias),
        "padded": lambda: pf.linear(padded, weight, bias),
        "padded_bookkept": bookkept,
    }
    torch.testing.assert_close(arms["padded"](), arms["torch"]())  # the caller's rows, exactly
    for fn in arms.values():
        per_call_us(fn, calls // 10)  # warm-up
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            times[arm].append(per_call_us(arms[arm], calls))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, Any]:
    median = {arm: statistics.median(values) for arm, values in times.items()}
    return {
        "us_per_call": median,
        "padded_over_bucket_us": median["padded"] - median["bucket"],
        "bookkept_over_bucket_us": median["padded_bookkept"] - median["bucket"],
        "saved_per_padded_call_us": median["padded_bookkept"] - median["padded"],
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    colors = ["#888888", "#4c72b0", "#4c72b0", "#55a868", "#c44e52"]
    title = "plancache.functional.linear at a padded row count (CPU, tiny tensors)"
    bar_chart(path, summary["us_per_call"], colors, "{:.1f}", "host µs per call (median)", title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    times = measure(args.rounds, args.calls)
    summary = summarize(times)
    print(table(["arm", "µs per call"], [[arm, summary["us_per_call"][arm]] for arm in ARMS]))
    print({k: round(v, 2) for k, v in summary.items() if isinstance(v, float)})
    import torch

    write_json(
        args.out / "padded_calls.json",
        {
            "summary": summary,
            "config": {**vars(args), "out": str(args.out), "torch": torch.__version__},
            "rounds": times,
        },
    )
    plot(summary, args.out / "padded_calls.png")


if __name__ == "__main__":
    main()
