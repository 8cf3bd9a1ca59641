"""A served geometry's plan raced against torch's function on a real GPU (plancache.functional._race): the
race runs at a geometry's first call past RACE_AFTER_S (0 here: its second call), says its verdict with both
times, keeps the program's counters and gradients to the program's own calls, and whichever runs the geometry
from then on gives torch's results; a compiled program leaves a call torch wins to torch as it is traced.
Which side wins is the GPU's: the tests force each (the margin) where they check what follows a verdict."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gpu.functional_helpers import _t, randn, rel_err

pytestmark = pytest.mark.gpu

TORCH_ALWAYS, PLAN_ALWAYS = 1.0, -1e9  # MARGIN: the plan wins where its time is under torch's * (1 - MARGIN)


@pytest.fixture
def raced(pf: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from plancache.functional import _race, _table

    _table.TABLE.clear()
    _table.COUNTS.clear()
    _race.KEPT.clear()
    pf.set_race_torch(True)
    monkeypatch.setattr(_race, "RACE_AFTER_S", 0.0)  # a geometry's race at its second call
    yield _race
    pf.set_race_torch(False)
    _table.TABLE.clear()


def _geometries(pf: Any, function: str) -> list[Any]:
    return [g for g in pf.geometries() if g.function == function]


def _geometry(pf: Any, function: str) -> Any:
    (found,) = _geometries(pf, function)
    return found


@pytest.mark.parametrize(("rows", "features"), [(64, 256), (8192, 4096)])
def test_a_linear_is_raced_at_its_first_call_and_the_faster_runs_it(
    pf: Any, raced: Any, rows: int, features: int
) -> None:
    torch = _t()
    x, w, b = randn(rows, features, dtype="bfloat16"), randn(features, features, dtype="bfloat16"), None
    first = pf.linear(x, w, b)
    assert pf.stats()["linear"].raced == 0  # a geometry's first call is not raced
    second = pf.linear(x, w, b)
    stats = pf.stats()["linear"]
    assert stats.raced == 1 and stats.cudnn == 2  # the race's runs are not the program's calls
    geometry = _geometry(pf, "linear")
    torch_won = geometry.plan is None
    assert torch_won == (stats.torch_geometries == 1)
    if torch_won:
        assert geometry.reason.startswith(raced.TORCH_FASTER) and "µs a call, the plan" in geometry.reason
    third = pf.linear(x, w, b)
    expected = torch.nn.functional.linear(x, w, b)
    assert all(rel_err(got, expected) < 2e-2 for got in (first, second, third))
    stats = pf.stats()["linear"]
    assert (stats.cudnn, stats.torch) == ((2, 1) if torch_won else (3, 0))
    print(f"linear {rows}x{features}: {geometry.reason or 'the plan won'}")


@pytest.mark.parametrize("margin", [TORCH_ALWAYS, PLAN_ALWAYS])
def test_a_trained_geometry_gives_torchs_gradients_whichever_won_and_the_race_touches_no_grad(
    pf: Any, raced: Any, monkeypatch: pytest.MonkeyPatch, margin: float
) -> None:
    torch = _t()
    monkeypatch.setattr(raced, "MARGIN", margin)
    x = randn(512, 1024, dtype="bfloat16").requires_grad_(True)
    w = randn(1024, 1024, dtype="bfloat16", scale=0.05).requires_grad_(True)
    b = randn(1024, dtype="bfloat16").requires_grad_(True)
    ref = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    torch.nn.functional.gelu(torch.nn.functional.linear(*ref)).float().square().mean().backward()
    for step in range(3):  # the plan's, the raced call (its result the plan's), the winner's
        for t in (x, w, b):
            t.grad = None
        y = pf.linear(x, w, b, activation="gelu")
        y.float().square().mean().backward()
        for got, want in zip((x, w, b), ref, strict=True):
            assert rel_err(got.grad, want.grad) < 5e-2, (step, margin)
    stats = pf.stats()["linear"]
    assert stats.raced == 1
    assert stats.torch_geometries == (1 if margin == TORCH_ALWAYS else 0)
    assert (stats.cudnn, stats.torch) == ((2, 1) if margin == TORCH_ALWAYS else (3, 0))


@pytest.mark.parametrize("margin", [TORCH_ALWAYS, PLAN_ALWAYS])
def test_a_compiled_call_is_torchs_in_the_traced_program_where_torch_wins(
    pf: Any, raced: Any, monkeypatch: pytest.MonkeyPatch, margin: float
) -> None:
    """Torch's function faster: plancache.functional's race says so, the traced program calls torch's function.
    The plan faster: its operator races too (what the compiled program calls), and keeps the call."""
    torch = _t()
    import plancache.torch as pt
    from plancache.torch import _mode

    pt.clear_stats()
    # What traced programs left to torch outlives clear_stats() (a program is not traced again): the other
    # margin's run of this test left its reasons there (GPU run 52: this test's second run read the first's).
    _mode.LEFT_COMPILED.clear()
    monkeypatch.setattr(raced, "MARGIN", margin)
    norm = torch.nn.LayerNorm(1024).cuda().to(torch.bfloat16)
    lin = torch.nn.Linear(1024, 1024).cuda().to(torch.bfloat16)

    def fn(x: Any) -> Any:
        return lin(norm(x))

    torch._dynamo.reset()
    x = randn(256, 1024, dtype="bfloat16")
    with torch.no_grad():
        got = pt.compile(fn, fullgraph=True, backend="aot_eager")(x)
        expected = fn(x)
    assert rel_err(got, expected) < 2e-2
    left = {function: s.left_compiled for function, s in pt.stats().items()}
    for function in ("linear", "layer_norm"):
        torch_won = any(reason.startswith(raced.TORCH_FASTER) for reason in left.get(function, ()))
        assert torch_won == (margin == TORCH_ALWAYS), left
        assert pf.stats()[function].raced == 1  # plancache.functional's race once; its operator's is not counted
        (geometry,) = _geometries(pf, function)
        assert geometry.race is not None and "µs a call" in geometry.race  # both times, whichever won
    assert pt.stats()["linear"].raced == 1


@pytest.mark.parametrize("margin", [TORCH_ALWAYS, PLAN_ALWAYS])
def test_a_served_layer_torch_wins_goes_back_to_its_own_forward(
    pf: Any, raced: Any, monkeypatch: pytest.MonkeyPatch, margin: float
) -> None:
    """serve(model) on the GPU: a Linear layer and a LayerNorm whose geometries' races torch wins go back to
    their own forwards RETURN_AFTER calls later (stats().returned), their results torch's throughout; where the
    plans win they stay served and the plans run every call. Each verdict's two times are printed (the plan's
    include the served layer's lookup: _race.LOOKUP)."""
    torch = _t()
    import plancache.torch as pt
    from plancache.torch import _serve

    pt.clear_stats()
    monkeypatch.setattr(raced, "MARGIN", margin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 1024)).cuda().to(torch.bfloat16)
    reference = model  # never served: serve() takes a copy
    served = pt.serve(copy.deepcopy(model))
    x = randn(256, 1024, dtype="bfloat16")
    with torch.no_grad():
        expected = reference(x)
        for _ in range(2 + _serve.RETURN_AFTER):  # the first call, the raced one, then RETURN_AFTER calls
            assert rel_err(served(x), expected) < 2e-2
    stats = pt.stats()
    torch_won = margin == TORCH_ALWAYS
    for function, layer in (("layer_norm", served[0]), ("linear", served[1])):
        assert pf.stats()[function].raced == 1
        assert stats[function].returned == (1 if torch_won else 0), stats[function]
        assert _serve.served(layer) == (not torch_won)
        (geometry,) = _geometries(pf, function)
        assert geometry.race is not None and "µs a call" in geometry.race
        print(f"served {function}: {geometry.race}")
    if not torch_won:
        assert pf.stats()["linear"].cudnn == 2 + _serve.RETURN_AFTER


def test_a_compiled_layer_whose_plans_are_not_stored_is_torchs_then_the_next_trace_races_them(
    pf: Any, raced: Any, gpu_server: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that hedges (every client's default): a served layer traced before its plans are stored is
    torch's in the compiled program (said in left_compiled), its trace asks the service once and waits for no
    build; the service builds the plans meanwhile, and a later trace (a process's next, as dynamo's reset
    stands in for) races them. Where the plan wins (the margin forces it) the operator is traced."""
    import time

    from plancache import Client
    from plancache.frontdoors.service import SERVICE
    from plancache.functional import _first_call

    torch = _t()
    import plancache.torch as pt
    from plancache.torch import _mode

    own = SERVICE.client()
    hedging = Client(gpu_server["address"], trusted_keys=[gpu_server["public_key"]], allow_unsigned=False, cache=False)
    pf.configure(hedging)
    try:
        monkeypatch.setattr(raced, "MARGIN", PLAN_ALWAYS)
        torch.manual_seed(0)
        layer = torch.nn.Linear(1536, 1536).cuda().to(torch.bfloat16)  # a geometry no other test asks for
        served = pt.serve(copy.deepcopy(layer))
        x = randn(384, 1536, dtype="bfloat16")

        def trace() -> tuple[Any, tuple[str, ...], float]:
            raced.KEPT.clear()
            pt.clear_stats()
            _mode.LEFT_COMPILED.clear()
            torch._dynamo.reset()
            started = time.perf_counter()
            with torch.no_grad():
                got = torch.compile(served, fullgraph=True, backend="aot_eager")(x)
            torch.cuda.synchronize()
            return got, pt.stats()["linear"].left_compiled, time.perf_counter() - started

        with torch.no_grad():
            expected = layer(x)
        got, left, seconds = trace()
        assert rel_err(got, expected) < 2e-2
        assert left == (_first_call.NOT_STORED,), left
        assert pf.stats()["linear"].cudnn == 0
        print(f"traced with nothing stored in {seconds:.2f} s: {left}")
        deadline = time.monotonic() + 120
        while True:  # the service's build, which nobody waited for
            from plancache.functional import _table

            _table.TABLE.clear()
            got, left, seconds = trace()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert left == (), left  # stored: raced, and the plan (forced to win) traced
        assert rel_err(got, expected) < 2e-2
        assert pf.stats()["linear"].raced == 1
        print(f"traced with its plans stored in {seconds:.2f} s")
    finally:
        pf.configure(own)
        hedging.close()
