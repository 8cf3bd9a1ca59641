"""The hedged miss on a real GPU (plancache.transport.hedge): the node's own
heuristic build (plancache.run.local) runs correctly and says what the
worker's plan says of its tensors; a hedged compile of a plan the service
does not hold runs whichever plan is ready first and the service's plan
takes over at a later call, both matching torch; a frontend program with
one line changed races its own build and its outputs still match torch;
plancache.functional's first call of a geometry does the same. Misses are
made by asking with options no other test uses (heuristic modes "A" alone):
the same graphs, other plan keys."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from examples.generate import EXAMPLES
from plancache import Client, CompileOptions, race_stats
from plancache.keys.query import PlanQuery
from plancache.transport import hedge

pytestmark = pytest.mark.gpu

CASES = ("matmul_fp16", "conv_bias_relu_fp16", "sdpa_causal_fp16", "matmul_bias_relu_bf16")
MISS_OPTIONS = CompileOptions(heuristic_modes=("A",))
TOLERANCE = 1e-2
TAKEOVER_S = 300.0


def _checked(case: str, plan: Any) -> dict[str, Any]:
    from tests.gpu.client_check import check

    results = check(case, plan)
    for name, result in results.items():
        assert result["rel_err"] < result.get("tolerance", TOLERANCE), f"{case} {name} ({plan.source}): {result}"
    return results


def _client(gpu_session: dict[str, Any], **kwargs: Any) -> Client:
    return Client(
        gpu_session["address"], cache=False, trusted_keys=[gpu_session["public_key"]], allow_unsigned=False, **kwargs
    )


@pytest.mark.parametrize("case", CASES)
def test_the_nodes_own_build_runs_and_binds_as_the_workers_plan(gpu_session: dict[str, Any], case: str) -> None:
    from plancache.gpu.target import detect_target
    from plancache.run.local import build_local

    query = PlanQuery.of(EXAMPLES[case](), detect_target())
    key = query.key
    local = build_local(query)
    assert local.source == "local" and local.local and local.blob == b"" and local.provisional
    _checked(case, local)
    with _client(gpu_session) as client:
        stored = client.get(key)  # the session compiled every example with the default options
    assert list(local.metadata.tensors) == list(
        stored.metadata.tensors
    )  # one function makes both (plancache.wire.bindings.tensor_bindings)
    with pytest.raises(Exception, match="no stored form"):
        local.to_bytes()


@pytest.mark.parametrize("case", CASES)
def test_a_hedged_miss_runs_the_first_ready_plan_then_the_services(gpu_session: dict[str, Any], case: str) -> None:
    hedge.reset_race_stats()
    with _client(gpu_session) as client:
        started = time.perf_counter()
        plan = client.compile(EXAMPLES[case](), gpu_session["target"], MISS_OPTIONS)
        first_s = time.perf_counter() - started
        first_source = plan.source
        races = race_stats()["compile"]
        assert races.local_won + races.service_won == 1, races
        assert (first_source == "local") == (races.local_won == 1), (first_source, races)
        _checked(case, plan)
        if first_source == "local":
            deadline = time.monotonic() + TAKEOVER_S
            while plan.local and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.1)
            assert not plan.local, f"the service's plan did not take over within {TAKEOVER_S} s"  # type: ignore[attr-defined]
            _checked(case, plan)  # the service's plan now, on the same Plan object
            assert plan.source in ("compiled", "provisional", "joined") and plan.metadata.built_by != "", plan
            assert race_stats()["compile"].replaced == 1
    record = {
        "case": case,
        "first_source": first_source,
        "first_s": first_s,
        "final_source": plan.source,
        "races": dataclasses.asdict(race_stats()["compile"]),
    }
    with open(Path(gpu_session["out"]) / "hedge.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def test_a_hit_never_starts_a_local_build(gpu_session: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    hedge.reset_race_stats()
    built: list[str] = []
    with _client(gpu_session) as client:
        real = client.local_builder.build
        monkeypatch.setattr(client.local_builder, "build", lambda *a, **k: built.append(a[2]) or real(*a, **k))
        plan = client.compile(EXAMPLES["matmul_fp16"](), gpu_session["target"])  # stored by the session
    assert plan.source == "hit" and built == [] and race_stats()["compile"] == hedge.RaceCounts()


def _invalidate_once_tuned(gpu_session: dict[str, Any], plan_keys: list[str]) -> None:
    """Each plan invalidated once the service has stored its tuned plan: a build in flight (a hedged node's
    yields, GPU run 42: held until its node stops asking, then built for the next nodes) stores its plan after an
    invalidation made before it ends, and so does the tune that replaces a provisional plan (GPU run 43: the
    heuristic plan invalidated, its tuned plan stored after it, the next program found that graph stored)."""
    with _client(gpu_session) as client:
        deadline = time.monotonic() + 180
        waiting = set(plan_keys)
        while waiting:
            stored = set(client.admin.list_plans())
            waiting -= {key for key in waiting & stored if not client.get(key).provisional}
            assert time.monotonic() < deadline, f"plans {sorted(waiting)} were not stored tuned within 180 s"
            if waiting:
                time.sleep(0.25)
        for key in plan_keys:
            client.admin.invalidate(key)


def test_a_frontend_program_races_its_own_build(gpu_session: dict[str, Any], tmp_path: Path) -> None:
    from tests.gpu.test_gpu_frontend_shim import SERVED, _env, _run

    seen = _run(
        _env(gpu_session, tmp_path / "cache-0"), tmp_path, "hedge-keys"
    )  # its two graphs (stored by the shim's tests, or built for this run: one may be its own build)
    plan_keys = [g["key"] for g in seen["graphs"]]  # a graph its own build ran still names the key it asked for
    assert all(plan_keys), seen["graphs"]
    _invalidate_once_tuned(gpu_session, plan_keys)
    result = _run(
        _env(gpu_session, tmp_path / "cache-1", PLANCACHE_HEDGE="1"), tmp_path, "hedged"
    )  # its outputs match torch (checked by _run)
    sources = {g["name"]: g["source"] for g in result["graphs"]}
    assert set(sources.values()) <= SERVED | {"local"}, result["graphs"]
    races = result["races"]
    assert races["local_won"] + races["service_won"] == 2 and races["service_failed"] == races["local_failed"] == 0, (
        races
    )
    assert all(g["reason"] is None or g["reason"].startswith("hedged miss") for g in result["graphs"]), result["graphs"]
    with open(Path(gpu_session["out"]) / "hedge.jsonl", "a") as f:
        f.write(json.dumps({"case": "walkthrough program", "sources": sources, "races": races}) + "\n")
    # Not stored, as test_gpu_frontend_shim.py expects of its first run whatever the order.
    _invalidate_once_tuned(gpu_session, plan_keys)


def test_a_functional_first_call_races_its_own_build(gpu_session: dict[str, Any], tmp_path: Path) -> None:
    import torch

    import plancache.functional as pf

    hedge.reset_race_stats()
    pf.clear()
    client = _client(gpu_session)
    pf.configure(client, options=MISS_OPTIONS)
    pf.set_race_torch(False)  # the race of the node's build against the service's is under test, not torch's
    try:
        x, w, b = (torch.randn(*s, device="cuda", dtype=torch.float16) for s in ((8, 96, 320), (192, 320), (192,)))
        reference = torch.nn.functional.linear(x.float(), w.float(), b.float()).relu()
        out = pf.linear(x, w, b, activation="relu")
        torch.cuda.synchronize()
        assert float((out.float() - reference).abs().max() / reference.abs().max()) < TOLERANCE
        races = race_stats()["functional"]
        assert races.local_won + races.service_won == 1, races
        assert len(pf.geometries()) == 1
        deadline = time.monotonic() + TAKEOVER_S
        while races.local_won and race_stats()["functional"].replaced == 0 and time.monotonic() < deadline:
            pf.linear(x, w, b, activation="relu")
            time.sleep(0.1)
        out = pf.linear(x, w, b, activation="relu")
        torch.cuda.synchronize()
        assert float((out.float() - reference).abs().max() / reference.abs().max()) < TOLERANCE
        if races.local_won:
            assert race_stats()["functional"].replaced == 1
        assert pf.stats()["linear"].torch == 0 and len(pf.geometries()) == 1
    finally:
        pf.clear()
        client.close()
