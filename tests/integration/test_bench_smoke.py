"""The benchmarks run (a short run; the figures themselves live in bench/results/)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO, child_env

pytestmark = pytest.mark.slow


def run_bench(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`bench/<script>` with `args` in a child process (the repo's environment); it must exit 0."""
    proc = subprocess.run(
        [sys.executable, f"bench/{script}", *args], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_cpu_benchmark_quick_run_writes_its_table_json_and_plot(tmp_path: Path) -> None:
    proc = run_bench("cpu_bench.py", "--quick", "--out", str(tmp_path))
    assert "hit p50 / floor" in proc.stdout
    results = json.loads((tmp_path / "cpu_bench.json").read_text())
    assert set(results["hit_path"]["1"]) == {"plancache", "plancache_no_memory_cache", "echo", "echo_aio", "redis_get"}
    assert results["summary"]["coalescing_builds"] == [1, 1]
    assert (
        results["summary"]["client_cache_hit_ms"] > 0 and results["startup_fetch"]["streamed_plans_per_s"]["median"] > 0
    )
    assert (tmp_path / "cpu_bench.png").stat().st_size > 10_000


def test_jcs_benchmark_quick_run_finds_the_same_bytes_on_every_spec(tmp_path: Path) -> None:
    run_bench("jcs_bench.py", "--quick", "--out", str(tmp_path))
    results = json.loads((tmp_path / "jcs_bench.json").read_text())
    assert results["all_identical"] and len(results["specs"]) >= 40
    assert results["hit_path"]["matmul_spec"]["compile_disk_cache_hit_us"] > 0


def test_capture_cost_short_run_times_every_piece_of_every_graph_and_a_fresh_processes_first_graphs(
    tmp_path: Path,
) -> None:
    pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
    run_bench("capture_cost.py", "--rounds", "1", "--calls", "2", "--fresh", "1", "--out", str(tmp_path))
    results = json.loads((tmp_path / "capture_cost.json").read_text())
    assert len(results["graphs"]) == 13
    for piece in ("read", "rebuild", "compare", "capture", "key"):
        assert all(results["median_us"][piece][name] > 0 for name in results["graphs"]), piece
    assert set(results["fresh"]["median_ms"]) == {f"graph{i}_{p}_ms" for i in (1, 2) for p in ("capture", "key")}
    assert (tmp_path / "capture_cost.png").stat().st_size > 10_000


def test_gc_pauses_short_run_times_each_kind_of_process_and_the_collectors_share(tmp_path: Path) -> None:
    pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
    run_bench("gc_pauses.py", "--rounds", "1", "--out", str(tmp_path))
    results = json.loads((tmp_path / "gc_pauses.json").read_text())
    for mode in ("plain", "client", "frozen"):
        (run,) = results["runs"][mode]
        assert 0 <= run["gc_pause_s"] < run["s"], (mode, run)
    # Frozen, what set-up made is not tracked any more: its collections walk only what the planning made.
    assert results["runs"]["frozen"][0]["tracked"] < results["runs"]["plain"][0]["tracked"] / 10
    assert (tmp_path / "gc_pauses.png").stat().st_size > 10_000


def test_gpu_benchmark_report_renders_without_a_gpu(tmp_path: Path) -> None:
    from bench.gpu_bench import report

    rows = [
        {
            "case": f"case{i}",
            "family": "matmul",
            "plans": 3,
            "build_s": 3.0,
            "autotune_s": 0.5,
            "ready_s": 0.01,
            "fetch_s": 0.003,
            "tuned_ms": 0.1,
            "plan0_ms": 0.1 + i / 100,
            "torch_ms": 0.12,
            "blob_bytes": 40_000,
            "deserialize_s": 0.007,
            "deserialize_again_s": 0.001,
        }
        for i in range(3)
    ] + [{"case": "broken", "error": "CompileFailed: no engine"}]
    report(rows, tmp_path)
    summary = json.loads((tmp_path / "gpu_bench.json").read_text())["summary"]
    assert summary["measured"] == 3 and summary["build_over_ready_median"] == pytest.approx(350)
    assert (tmp_path / "gpu_bench.png").stat().st_size > 10_000


def test_startup_benchmark_merges_runs_and_reports_its_ratios_without_a_gpu(tmp_path: Path) -> None:
    def run(jit: str, path: str, total: float, **extra: object) -> dict[str, object]:
        return {"jit": jit, "path": path, "total_s": total, **extra}

    def per_graph(last: float, tuned: float | None = None) -> dict[str, object]:
        times = {"runnable_s": [last * (i + 1) / 13 for i in range(13)]}
        return times | ({"tuned_s": [tuned * (i + 1) / 13 for i in range(13)], "tuned_all_s": tuned} if tuned else {})

    runs = []
    pool = {
        "build_processes": 8,
        "processes": 9,
        "mib": 4500.0,
        "per_process_mib": [500.0] * 9,
        "apps_listed": 10,
        "device_growth_mib": 4600.0,
    }
    for jit, local in (("cold", 6.0), ("warm", 2.0)):
        runs += [
            run(jit, "local-heuristic", local, **per_graph(local)),
            run(jit, "local-heuristic", local + 0.2),
            run(jit, "local-autotuned", 20.0),
        ]
        runs += [
            run(jit, "local-heuristic-4proc", local / 2),
            run(jit, "fetch", 0.3),
            run(jit, "prefetch", 0.25),
            run(jit, "floor", 0.2),
        ]
        runs += [
            run(jit, "background", 2.03, after_foreground_s=0.03),
            run(jit, "first-compile", local * 1.1, pool=pool, **per_graph(local * 1.1, 8.0)),
        ]
        runs += [run(jit, "first-lazy", (local + 0.65) * 1.3, lazy_s=0.05, graphs=13, **per_graph(local + 0.65, 9.0))]
        runs += [run(jit, "first-compile-4proc", local / 2 * 1.15, **per_graph(local / 2 * 1.15, 12.0))]
    runs += [
        run("cold", "first-prefetch", 3.0, **per_graph(3.0, 7.0)),
        run("warm", "first-node", 1.0, tuned_all_s=30.0),
    ]  # its name before issue 22
    # The drop-in's floor and the quiet-worker diagnosis, each paired with the local program just before it.
    runs += [
        run("warm", "local-program", 1.0),
        run("warm", "floor-program", 0.34),
        run("warm", "local-program", 1.2),
        run("warm", "first-dropin+quiet+hedge", 1.32),
        run("warm", "local-program", 1.0),
        run("warm", "stored-dropin", 0.37),
    ]
    for jit in ("cold", "warm"):
        (tmp_path / f"{jit}.json").write_text(
            json.dumps({"runs": [r for r in runs if r["jit"] == jit], "skipped": [], "config": {"repeats": 2}})
        )
    failed = [
        {"jit": "cold", "path": "fetch", "error": "boom"},
        {"jit": "cold", "path": "first-lazy", "total_s": 0.1, "error": "keys differ"},
    ]
    (tmp_path / "cold.json").write_text(json.dumps({"runs": [r for r in runs if r["jit"] == "cold"] + failed}))
    proc = subprocess.run(
        [
            sys.executable,
            "bench/startup.py",
            "--merge",
            str(tmp_path / "cold.json"),
            str(tmp_path / "warm.json"),
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "startup.json").read_text())
    cold, warm = results["summary"]["cold"], results["summary"]["warm"]
    assert cold["local_over_fetch"] == pytest.approx(6.1 / 0.3) and warm["prefetch_over_floor"] == pytest.approx(1.25)
    assert cold["first_compile_over_local"] == pytest.approx(6.6 / 6.1) and cold["met"]["first_compile_over_local"]
    # The local build with the same 13 sleeps of 50 ms; a failed run is no sample.
    assert cold["local_lazy_s"] == pytest.approx(6.1 + 0.65) and cold["first_lazy_over_local_lazy"] == pytest.approx(
        6.65 * 1.3 / 6.75
    )
    assert cold["met"]["first_lazy_over_local_lazy"] is False and cold["n"]["first-lazy"] == 1
    assert cold["first_4proc_over_local_4proc"] == pytest.approx(1.15) and cold["met"]["first_4proc_over_local_4proc"]
    assert cold["first_prefetch_over_local"] == pytest.approx(3.0 / 6.1) and cold["met"]["first_prefetch_over_local"]
    assert warm["first_prefetch_over_local"] == pytest.approx(1.0 / 2.1)  # from the run named first-node
    assert cold["tuned_all_s"] == {
        "first-compile": 8.0,
        "first-lazy": 9.0,
        "first-compile-4proc": 12.0,
        "first-prefetch": 7.0,
    }
    assert (
        cold["tuned_over_local_autotune"]["first-compile"] == pytest.approx(0.4)
        and cold["met"]["tuned_over_local_autotune/first-compile"]
    )
    assert cold["met"]["tuned_over_local_autotune/first-compile-4proc"] is False and warm["tuned_over_local_autotune"][
        "first-prefetch"
    ] == pytest.approx(1.5)
    assert warm["floor_program_over_local_program"] == pytest.approx(0.34)
    assert warm["first_dropin_quiet_hedge_over_local_program"] == pytest.approx(1.1)
    assert warm["stored_dropin_over_local_program"] == pytest.approx(0.37)
    assert warm["stored_dropin_over_floor_program"] == pytest.approx(0.37 / 0.34)
    assert warm["background_after_foreground_s"] == pytest.approx(0.03) and warm["met"]["background_after_foreground_s"]
    assert cold["met"]["local_over_fetch"] and not warm["met"]["fetch_over_floor"] and cold["pool"] == pool
    assert (
        results["summary"]["errors"] == ["cold/fetch: boom", "cold/first-lazy: keys differ"]
        and len(results["graph_names"]) == 13
    )
    for name in ("startup.png", "startup_timeline.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000
    section = "\n".join(
        runpy.run_path(str(REPO / "scripts" / "performance-doc.py"))["startup_section"](results, "run.md")
    )
    assert "| first-compile / local heuristic build | 1.08x | 1.05x | ≤ 1.2x | yes / yes |" in section
    assert (
        "| first-compile-4proc: every plan tuned and stored / local autotune loop | 0.60x | 0.60x | ≤ 0.5x | **no** / **no** |"
        in section
    )
    assert (
        "4,600 MiB (8 build processes + the worker; 4,500 MiB in 9 processes)" in section
        and "| qkv_s512 | 0.46 |" in section
    )


def test_autotune_benchmark_report_renders_without_a_gpu(tmp_path: Path) -> None:
    from bench.autotune import report

    def row(name: str, ratio: float, screened_ms: float) -> dict[str, object]:
        strategy = {
            "seconds": 1.0,
            "ms_per_candidate": screened_ms,
            "chosen": 1,
            "precisely_timed": 3,
            "failed": 0,
            "times_ms": [],
        }
        return {
            "graph": name,
            "candidates": 20,
            "build_all_s": 2.0,
            "screened": strategy,
            "exhaustive": {**strategy, "ms_per_candidate": 120.0},
            "screened_over_exhaustive": ratio,
            "tuned_over_heuristic": 0.9,
        }

    summary = report(
        [row("a", 1.0, 20.0), row("b", 1.03, 40.0), {"graph": "c", "error": "CompileFailed: x"}], ["d"], tmp_path
    )
    assert summary["ms_per_candidate_median"] == {"screened": 30.0, "exhaustive": 120.0}
    assert summary["beyond_2_percent"] == {"b": 1.03} and summary["skipped"] == ["d"] and "c" in summary["errors"]
    assert (tmp_path / "autotune.png").stat().st_size > 10_000


def test_load_test_short_run_loses_and_confuses_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "bench/load_test.py",
            "--requests",
            "2000",
            "--clients",
            "8",
            "--outage",
            "0.5",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "load_test.json").read_text())
    assert result["requests"] == 2000 and result["wrong_plans"] == 0 and result["lost"] == 0
    assert result["succeeded"] + sum(result["failed"].values()) == 2000


def test_herd_quick_run_builds_each_key_once_and_writes_its_json_and_plot(tmp_path: Path) -> None:
    # A budget the quick run finishes well inside (~20 s alone): each variant's deadline is its share of it, and
    # a node refused for now past its deadline counts an error (once with 150 s, the suite at -n 4 on two cores).
    proc = run_bench("herd.py", "--quick", "--time-limit", "300", "--out", str(tmp_path), timeout=330)
    assert "builds per key" in proc.stdout
    results = json.loads((tmp_path / "herd.json").read_text())
    assert set(results["variants"]) == {"prefetch", "compile", "burst"}
    for name, variant in results["variants"].items():
        assert variant["builds_per_key"] and all(b == 1 for b in variant["builds_per_key"]), (
            name,
            variant["builds_per_key"],
        )
    assert results["variants"]["prefetch"]["errors_total"] == 0, results["variants"]["prefetch"]["errors_by_code"]
    assert (tmp_path / "herd.png").stat().st_size > 10_000


def test_miss_cost_quick_run_builds_every_graph_here_and_splits_its_time(tmp_path: Path) -> None:
    """bench/miss_cost.py, three rounds: every hedged call was a miss whose node-side build ran (the stand-in's
    clock inside it), each answered by one of the two sides, in both ways of waiting; the figures are the parts of
    the calls they name."""
    proc = run_bench("miss_cost.py", "--rounds", "3", "--calls", "3", "--build-ms", "20", "--out", str(tmp_path))
    assert "fixed cost" in proc.stdout
    results = json.loads((tmp_path / "miss_cost.json").read_text())
    assert results["ms"]["local"]["median"] >= 20  # the spin ran its 20 ms
    for mode in ("future", "kept"):
        assert sum(results[mode]["sources"].values()) == 3 * 3, mode  # the rounds' calls (the warm-up's not counted)
        assert set(results[mode]["sources"]) <= {"local", "compiled"}
        assert results["build_inside_ms"][mode]["median"] >= 20
        assert results["ms"][mode]["median"] >= results["build_inside_ms"][mode]["median"]  # the build is inside
        # the ratio itself is the machine's to say (under the suite's load a preempted local spin reads longer)
        assert results[mode]["fixed_cost_ms"] >= 0 and results[mode]["build_slowdown"] > 0
    assert (tmp_path / "miss_cost.png").stat().st_size > 10_000


@pytest.mark.parametrize("door", ["cudnn", "compile"])
def test_dropin_own_quick_run_times_every_hedged_miss_past_the_first_two_at_each_pause(
    tmp_path: Path, door: str
) -> None:
    """bench/dropin_own.py, one process an arm and pause: every one of the 13 start-up graphs past a client's first
    two was a hedged miss the node's build won (the child refuses any other), timed at each pause."""
    pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
    args = ("--door", door, "--pause-ms", "0", "--pause-ms", "5", "--processes", "1", "--rounds", "1")
    run_bench("dropin_own.py", *args, "--build-ms", "5", "--out", str(tmp_path), "--tag", "t")
    results = json.loads((tmp_path / "dropin_own_t.json").read_text())
    assert results["door"] == door and results["pauses_ms"] == [0.0, 5.0]
    assert results["graphs_per_arm"] == {"shipped +0 ms": 11, "shipped +5 ms": 11}
    for medians in results["median_ms"].values():
        assert medians["own"] > 0 and medians["capture"] > 0
    assert (tmp_path / "dropin_own_t.png").stat().st_size > 10_000


def test_dropin_own_stored_door_serves_every_graph_from_the_store(tmp_path: Path) -> None:
    """bench/dropin_own.py --door stored: a fresh process's 13 graphs through the drop-in, each served by the plan an
    earlier run of the workload stored (the child refuses a graph built any other way), every graph timed."""
    pytest.importorskip("cudnn", reason="needs the cuDNN frontend's Python IR (nvidia-cudnn-frontend)")
    run_bench("dropin_own.py", "--door", "stored", "--processes", "1", "--rounds", "1", "--out", str(tmp_path))
    results = json.loads((tmp_path / "dropin_own.json").read_text())
    assert results["door"] == "stored" and results["graphs_per_arm"] == {"shipped": 13}
    medians = results["median_ms"]["shipped"]
    assert medians["own"] > 0 and medians["capture"] > 0 and medians["race"] > 0


def test_flood_quick_run_answers_every_flooder_call_and_no_honest_call_fails(tmp_path: Path) -> None:
    """bench/flood.py --quick (a tenth of the flood, short phases): every call the flooder made ends with a
    status it counts, no honest node's read or compile fails, nothing is left queued, the JSON and plot
    written."""
    run_bench("flood.py", "--quick", "--out", str(tmp_path))
    results = json.loads((tmp_path / "flood.json").read_text())
    outcomes = results["flooder"]["outcomes"]
    calls = {
        "abandoned compiles": 70,
        "unread streams": 70,
        "distinct compiles": 100,
    }
    for what, n in calls.items():
        assert sum(outcomes[what].values()) == n, (what, outcomes)
    for phase in ("idle", "flood", "after"):
        assert results["honest_getplan"][phase]["calls"] > 0
        assert not results["honest_getplan"][phase]["errors"], results["honest_getplan"]
        assert not results["honest_compile"][phase]["errors"], results["honest_compile"]
    assert results["queue_after"] == 0
    assert (tmp_path / "flood.png").stat().st_size > 10_000


def test_execution_benchmark_summary_and_report_render_without_a_gpu(tmp_path: Path) -> None:
    from bench.gpu_exec import PATHS, SEED, report, summarize

    def row(case: str, bound: float, replay: float) -> dict[str, object]:
        host = {"previous": 60.0, "execute": 45.0, "bound": bound, "replay": replay, "raw": 15.0, "torch": 12.0}
        return {
            "case": case,
            "calls_per_sample": 200,
            "workspace_bytes": 0,
            "host_us": host,
            "stream_us": dict.fromkeys(PATHS, 20.0),
            "bound_over_raw_host": bound / 15.0,
            "execute_over_raw_host": 3.0,
            "execute_over_previous_host": 0.75,
            "replay_over_torch_host": replay / 12.0,
        }

    rows = [row(SEED, 15.6, 3.0), row("large", 18.0, 3.5)]
    memory = {"plans": 100, "one_per_plan_allocated_bytes": 100 << 20, "shared_allocated_bytes": 4 << 20}
    summary = summarize(rows, memory)
    assert summary["bound_over_raw_beyond_target"] == {"large": 1.2}
    assert summary["seed"]["replay_over_torch_host"] == pytest.approx(0.25)
    report({"rows": rows, "errors": {}, "summary": summary}, tmp_path)
    assert json.loads((tmp_path / "gpu_exec.json").read_text())["summary"]["memory"]["plans"] == 100
    assert (tmp_path / "gpu_exec.png").stat().st_size > 10_000


def test_upgrade_quick_run_writes_its_json_and_plot_and_its_figures_add_up(tmp_path: Path) -> None:
    """Not a timing test: the rehearsal runs end to end and its figures are computed from what it recorded."""
    proc = run_bench("upgrade.py", "--quick", "--out", str(tmp_path), timeout=150)
    assert "hit rate of all node requests" in proc.stdout
    results = json.loads((tmp_path / "upgrade.json").read_text())
    c, s = results["config"], results["summary"]
    assert (
        set(results["runs"]) == {"with", "without"}
        and len(results["hits"]) == c["specs"]
        and s["source_hits"] == sum(results["hits"])
    )
    for name, run in results["runs"].items():
        nodes = run["nodes"]
        assert len(nodes) == int(c["node_seconds"] / c["node_interval"]) and all("node" in n for n in nodes), (
            name,
            nodes,
        )
        for n in nodes:
            assert (
                n["requests"] == c["specs_per_node"] == len(set(n["draws"]))
                and n["hits"] + n["misses"] + n["errors"] == n["requests"]
            )
            assert (
                n["hit_rate"] == pytest.approx(n["hits"] / n["requests"])
                and n["fetched"] + n["provisional_hits"] == n["hits"]
            )
        total = s["hit_rate"][name]
        assert (total["requests"], total["hits"]) == (sum(n["requests"] for n in nodes), sum(n["hits"] for n in nodes))
        if s["window_start_s"] is not None:
            late = [n for n in nodes if n["start_s"] >= s["window_start_s"]]
            assert s["hit_rate_after_window"][name]["hits"] == sum(n["hits"] for n in late)
        coverage = [x["coverage"] for x in run["samples"]]
        assert (
            coverage == sorted(coverage) and coverage[0] >= 0 and coverage[-1] <= 1
        )  # plans are only added (no bound)
        reached = [v for v in s["coverage_s"][name].values() if v is not None]
        assert reached == sorted(reached)
        assert all(
            x["warm_coverage"] >= x["coverage"] - 1e-9 for x in run["samples"] if "warm_coverage" in x
        )  # read after the plans
        assert all(m["source"] in ("compiled", "provisional") for m in run["misses"]), run["misses"]
    status = results["runs"]["with"]["warm_status"]
    assert status is not None and status["source_hits_24h"] == sum(results["hits"]) and status["total"] == c["specs"]
    assert status["built"] + status["skipped"] + status["failed"] + status["remaining"] == status["total"]
    assert results["runs"]["without"]["warm_status"] is None  # --no-warm: no plan at all
    kinds = [m["kind"] for m in results["misses"]["misses"]]
    assert kinds.count("idle") == c["quiet_misses"] and len(s["warming_miss_s"]) == kinds.count("warming")
    bound = results["bound"]
    assert bound["warm_status"] is not None and bound["stored_bytes"] > 0 and bound["a_plans"] == c["bound_specs"]
    assert [row[0] for row in results["targets"]] and all(len(row) == 4 for row in results["targets"])
    assert (tmp_path / "upgrade.png").stat().st_size > 10_000


def test_status_page_memory_benchmark_reads_the_pages_and_samples_the_gateway(tmp_path: Path) -> None:
    run_bench("status_page_memory.py", "--seconds", "4", "--out", str(tmp_path))
    result = json.loads((tmp_path / "status_page_memory.json").read_text())
    assert result["reads"] >= 300 and result["samples"] and result["rss_first_mib"] > 0
    assert (tmp_path / "status_page_memory.png").exists()


def test_compiled_guards_quick_run_times_both_compiled_programs_in_the_arms_client(tmp_path: Path) -> None:
    """bench/compiled_guards.py, one process: torch's and the served stack's compiled calls each timed in a process of
    the arm's client (the runner refuses a child that imported another), their ratio and difference written."""
    pytest.importorskip("torch", reason="plancache.torch needs torch (make test installs its CPU build)")
    client = str(REPO / "client" / "src")
    args = ("--arm", f"here={client}", "--processes", "1", "--rounds", "2", "--calls", "50")
    run_bench("compiled_guards.py", *args, "--out", str(tmp_path))
    results = json.loads((tmp_path / "compiled_guards.json").read_text())
    ((process,),) = results["per_process_us"].values()
    assert process["torch"] > 0 and process["served"] > 0
    assert results["served_over_torch"]["here"] == pytest.approx(process["served"] / process["torch"])
    assert (tmp_path / "compiled_guards.png").stat().st_size > 10_000


def test_compiled_trace_quick_run_traces_both_models_in_the_arms_client(tmp_path: Path) -> None:
    """bench/compiled_trace.py, one process: torch's and the served stack's traces each timed in a process of the
    arm's client, their difference and ratio written."""
    pytest.importorskip("torch", reason="plancache.torch needs torch (make test installs its CPU build)")
    client = str(REPO / "client" / "src")
    run_bench(
        "compiled_trace.py", "--arm", f"here={client}", "--processes", "1", "--traces", "3", "--out", str(tmp_path)
    )
    results = json.loads((tmp_path / "compiled_trace.json").read_text())
    ((process,),) = results["per_process_s"].values()
    assert process["torch"] > 0 and process["served"] > 0 and results["served_layer_calls"] == 72
    assert results["served_minus_torch_s"]["here"] == pytest.approx(process["served"] - process["torch"])
    assert (tmp_path / "compiled_trace.png").stat().st_size > 10_000


def test_the_startup_benchmarks_wait_for_builds_nobody_waited_for(redis_server: Any, redis_client: Any) -> None:
    """bench/torch_models_startup.py stops its worker once the builds its first processes asked for and did
    not wait for (plancache.torch's stored-only asks) are stored: no job queued or running in the store."""
    from bench.startup_deploy import wait_builds_settled
    from plancache_server.store import keys

    redis_client.hset(keys.job_state("k1"), mapping={"state": "queued"})
    redis_client.hset(keys.job_state("k2"), mapping={"state": "done"})
    waited = wait_builds_settled(redis_server.url, timeout=0.6, poll_s=0.1)
    assert waited["settled_s"] is None and waited["jobs"] == 2
    redis_client.hset(keys.job_state("k1"), mapping={"state": "provisional"})  # stored; the worker tunes it
    assert wait_builds_settled(redis_server.url, timeout=5, poll_s=0.1)["settled_s"] is not None
