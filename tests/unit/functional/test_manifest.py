"""plancache.functional's manifest and prefetch, on this machine without
torch: a run's manifest names every plan its functions ran (forward and
backward graphs, not torch's geometries); a later process's prefetch
fetches and loads them on a background thread, so first calls ask the
service nothing and deserialize nothing; what the prefetch could not get
is asked for as usual; a waiting first call is bounded; and an edited
manifest never puts another graph's plan under a call."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import plancache.functional as pf
from plancache import InvalidRequest, NotFound
from plancache.functional import _autograd
from plancache.transport.manifest import Manifest, ManifestEntry
from tests.support.fake_gpu import FakeRuntime
from tests.support.frontdoor_standins import TARGET, StandInClient, StandInTensor, key_of
from tests.unit.functional.modes import set_modes
from tests.unit.functional.recording import RecordingFunction, backward

T = StandInTensor


def run_functions(grad: bool) -> None:
    """A linear with GELU (trained when `grad`) and an RMSNorm (inference)."""
    x, w, b = T((4, 16, 64), requires_grad=grad), T((32, 64), requires_grad=grad), T((32,), requires_grad=grad)
    pf.linear(x, w, b, activation="gelu")
    if grad:
        backward()
    with pytest.MonkeyPatch.context() as mp:
        set_modes(mp, grad_on=False)
        pf.rms_norm(T((4, 16, 64)), (64,), T((64,)), 1e-5)


@pytest.fixture
def trained(client: StandInClient, monkeypatch: pytest.MonkeyPatch) -> StandInClient:
    """A process whose functions ran with autograd (torch's Function recorded)."""
    set_modes(monkeypatch, grad_on=True)
    monkeypatch.setattr(_autograd, "_function", lambda: RecordingFunction)
    RecordingFunction.calls = []
    run_functions(grad=True)
    return client


def fresh_process(runtime: FakeRuntime, **client_options: Any) -> StandInClient:
    """What a new process has: no geometries, no deserialized graphs, a new client."""
    pf.clear()
    runtime.graphs.clear()
    standin = StandInClient(**client_options)
    pf.configure(standin, target=TARGET)
    return standin


def test_a_manifest_names_every_plan_the_functions_ran_forward_and_backward(
    trained: StandInClient, tmp_path: Path
) -> None:
    manifest = pf.manifest()
    names = [e.name for e in manifest.entries]
    assert sorted(names) == sorted(
        [
            "linear",
            "linear.backward.act",
            "linear.backward.dgrad",
            "linear.backward.wgrad",
            "linear.backward.bgrad",
            "rms_norm",
        ]
    )
    asked = {key_of(spec, TARGET, options) for spec, _, options in trained.asked}
    assert {
        e.key for e in manifest.entries
    } == asked and manifest.target == TARGET  # every plan asked for, keyed as the client keyed it
    manifest.save(tmp_path / "functions.json")
    again = Manifest.load(tmp_path / "functions.json")
    assert [(e.name, e.key) for e in again.entries] == [(e.name, e.key) for e in manifest.entries]


def test_geometries_torch_runs_are_not_in_it(client: StandInClient, torch_runs: list[Any]) -> None:
    client.error = NotFound("nothing here")
    pf.linear(T((4, 16, 64)), T((32, 64)))
    assert pf.stats()["linear"].torch == 1 and pf.manifest().entries == []


def test_a_prefetched_process_asks_nothing_and_deserializes_nothing_at_its_first_calls(
    trained: StandInClient,
    runtime: FakeRuntime,
    tmp_path: Path,
) -> None:
    pf.manifest().save(tmp_path / "functions.json")
    standin = fresh_process(runtime)
    result = pf.prefetch(tmp_path / "functions.json").wait(timeout=10)
    assert result.failed == 0 and len(result.plans) == 6 and len(standin.prefetched) == 6
    loaded = list(runtime.graphs)
    assert len(loaded) == 6  # deserialized on the prefetch's thread
    run_functions(grad=True)
    assert standin.asked == []  # no first call asked the service
    assert runtime.graphs == loaded  # nor deserialized again
    assert sum(len(g.calls) for g in loaded) == 6  # and every plan ran: forward, 4 backward graphs, rms_norm
    assert pf.stats()["linear"].cudnn == 1 and pf.stats()["rms_norm"].cudnn == 1


def test_what_the_prefetch_could_not_get_is_asked_for_as_usual(trained: StandInClient, runtime: FakeRuntime) -> None:
    manifest = pf.manifest()
    missing = next(e.key for e in manifest.entries if e.name == "rms_norm")
    standin = fresh_process(runtime, not_stored={missing})
    result = pf.prefetch(manifest).wait(timeout=10)
    assert result.failed == 1
    run_functions(grad=True)
    assert [spec.name for spec, _, _ in standin.asked] == ["plancache.functional.rms_norm"]


def test_an_edited_manifest_never_serves_another_graph(trained: StandInClient, runtime: FakeRuntime) -> None:
    """Entries swapped to specs of other geometries: the calls' own plans are asked for, the others never run."""
    manifest = pf.manifest()
    other = T((8, 16, 64), requires_grad=True)
    standin = fresh_process(runtime)
    pf.linear(other, T((32, 64)), T((32,)), activation="relu")  # a geometry the manifest will claim
    edited = pf.manifest()
    for entry in manifest.entries:
        entry.spec = edited.entries[0].spec  # every entry now names the relu linear's spec
    standin = fresh_process(runtime)
    pf.prefetch(manifest).wait(timeout=10)
    wrong = {g.blob for g in runtime.graphs}
    run_functions(grad=True)
    assert len(standin.asked) == 6  # each of the program's plans asked for under its own key
    used = {g.blob for g in runtime.graphs if g.calls}
    assert used and not used & wrong


def test_a_first_call_waits_for_a_plan_under_way_and_no_longer_than_its_bound(
    trained: StandInClient, runtime: FakeRuntime
) -> None:
    manifest = pf.manifest()
    release = threading.Event()

    class SlowClient(StandInClient):
        def prefetch(self, *args: Any, **kwargs: Any) -> Any:
            release.wait(10)
            return super().prefetch(*args, **kwargs)

    pf.clear()
    slow = SlowClient()
    pf.configure(slow, target=TARGET)
    pending = pf.prefetch(manifest)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (pf.rms_norm(T((4, 16, 64)), (64,), T((64,)), 1e-5), done.set()))
    with pytest.MonkeyPatch.context() as mp:
        set_modes(mp, grad_on=False)
        worker.start()
        assert not done.wait(0.2)  # waiting for the prefetch's plan, not asking
        release.set()
        worker.join(10)
    assert done.is_set() and slow.asked == [] and pending.wait(timeout=10).failed == 0

    # Bounded: with the service's timeout, a prefetch that never answers costs that long, then the service is asked.
    pf.clear()
    release.clear()
    stuck = SlowClient()
    pf.configure(stuck, target=TARGET, timeout=0.3)
    pf.prefetch(manifest)
    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        set_modes(mp, grad_on=False)
        pf.rms_norm(T((4, 16, 64)), (64,), T((64,)), 1e-5)
    assert 0.25 <= time.monotonic() - began < 5 and [spec.name for spec, _, _ in stuck.asked] == [
        "plancache.functional.rms_norm"
    ]
    release.set()


def test_a_manifest_of_keys_alone_is_refused(client: StandInClient) -> None:
    keyed = Manifest(entries=[ManifestEntry(key=key_of(pf_spec()))], target=TARGET)
    with pytest.raises(InvalidRequest, match="needs its spec"):
        pf.prefetch(keyed)


def pf_spec() -> Any:
    from plancache.functional._geometry import geo
    from plancache.functional._norms import rms_norm_request

    return rms_norm_request(geo("input", T((4, 16, 64))), (64,), geo("weight", T((64,))), 1e-5, training=False).spec


def test_cancelling_a_functional_prefetch_stops_its_stream(trained: StandInClient, runtime: FakeRuntime) -> None:
    """pf.prefetch(...).cancel() reaches the client's stream (its PrefetchStop), not only the plans still to come."""
    manifest = pf.manifest()
    stops: list[Any] = []
    release = threading.Event()

    class Streaming(StandInClient):
        def prefetch(self, *args: Any, **kwargs: Any) -> Any:
            stops.append(kwargs.get("stop"))
            release.wait(10)
            return super().prefetch(*args, **kwargs)

    pf.clear()
    pf.configure(Streaming(), target=TARGET)
    pending = pf.prefetch(manifest)
    deadline = time.monotonic() + 5
    while not stops and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stops and stops[0] is not None and not stops[0].stopped
    pending.cancel()
    assert stops[0].stopped and pending.cancelled
    release.set()
    pending.wait(timeout=10)
