"""A captured graph is the program's graph to cuDNN itself.

Random graphs built with the frontend's API (tests/support/random_pygraphs.py)
are validated and lowered by the frontend on the GPU (validate +
build_operation_graph, as the program's own build does); those it accepts
are captured, rebuilt from the spec the way the worker builds them, lowered
too, and the two lowered cuDNN graphs (the backend graph's JSON, after
cuDNN's own shape and layout inference) must be equal. The frontend's
recorded catalog must also be what the installed frontend says. Results per
family go to $PLANCACHE_TEST_GPU_OUT/frontend_graph.json."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from plancache import GraphSpec
from plancache.frontend_graph import build_pygraph, differences
from plancache.graphspec.validation import normalize
from tests.support.random_pygraphs import FAMILIES, random_graph

pytestmark = pytest.mark.gpu
SEEDS = range(int(os.environ.get("PLANCACHE_TEST_RANDOM_GRAPHS", "140")))
RECORDED = Path(__file__).resolve().parents[2] / "client/src/plancache/graphspec/frontend_ops.json"


@pytest.fixture(scope="module")
def frontend() -> Any:
    import cudnn

    return cudnn


@pytest.fixture(scope="module")
def handle(frontend: Any) -> Any:
    import torch

    h = frontend.create_handle()
    frontend.set_stream(h, torch.cuda.current_stream().cuda_stream)
    return h


def _lowered(g: Any, uids: list[int]) -> dict[str, Any]:
    """cuDNN's graph as the frontend lowered it, after its inference: the
    frontend's own key of the lowered graph (a hash of its operations and
    tensors), and each tensor's attributes as the lowered graph reports them."""
    try:  # key() lowers the graph first where validate() left it unlowered (a python-native validator ran instead)
        found: dict[str, Any] = {"key": int(g.key())}
    except Exception as e:  # no backend lowering (a python-only node): what each graph says is compared instead
        return {"key": f"{type(e).__name__}: {e}"}
    lowered = g._lowered_graph
    for uid in uids:
        try:
            t = lowered.query_tensor_attributes_of_uid(uid)
        except Exception as e:  # a uid the lowered graph does not hold: what it says is compared too
            found[f"uid {uid}"] = f"{type(e).__name__}: {e}"
            continue
        found[f"uid {uid}"] = {
            name: str(getattr(t, f"get_{name}")())
            for name in ("dim", "stride", "data_type", "is_virtual", "is_pass_by_value")
            if callable(getattr(t, f"get_{name}", None))
        }
    return found


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def test_random_frontend_graphs_lower_to_the_same_cudnn_graph(frontend: Any, handle: Any) -> None:
    outcome: Counter[tuple[str, str]] = Counter()
    mismatches: list[dict[str, Any]] = []
    keys = 0  # graphs whose lowered graphs' keys were compared
    for seed in SEEDS:
        g, family = random_graph(frontend, seed, kernel_cache=frontend.create_kernel_cache(), handle=handle)
        try:
            g.validate()
            g.build_operation_graph()
        except Exception as e:  # the frontend or cuDNN refuses this random graph: a program could not build it either
            outcome[(family, f"refused natively: {type(e).__name__}")] += 1
            continue
        spec = normalize(GraphSpec.from_pygraph(g))
        python_view = differences(g, build_pygraph(spec, frontend))
        rebuilt = build_pygraph(spec, frontend, handle=handle)
        try:
            rebuilt.validate()
            rebuilt.build_operation_graph()
        except Exception as e:
            mismatches.append(
                {
                    "seed": seed,
                    "family": family,
                    "rebuilt refused": f"{type(e).__name__}: {e}"[:2000],
                    "spec": spec.to_json(),
                }
            )
            outcome[(family, "different")] += 1
            continue
        uids = sorted(t.uid for t in spec.tensors if t.uid is not None)
        program_lowered = _lowered(g, uids)
        found = _diff(program_lowered, _lowered(rebuilt, uids))
        keys += isinstance(program_lowered["key"], int)
        if found or python_view:
            mismatches.append(
                {
                    "seed": seed,
                    "family": family,
                    "cudnn": found[:20],
                    "python": python_view[:20],
                    "spec": spec.to_json(),
                }
            )
        outcome[(family, "different" if found or python_view else "the same")] += 1
    report = {
        "graphs": len(SEEDS),
        "keys_compared": keys,
        "outcomes": {f"{f}: {o}": n for (f, o), n in sorted(outcome.items())},
        "mismatches": mismatches,
    }
    out = Path(os.environ.get("PLANCACHE_TEST_GPU_OUT", "/tmp"))
    (out / "frontend_graph.json").write_text(json.dumps(report, indent=1))
    compared = sum(n for (_, o), n in outcome.items() if o != "different" and o.startswith("the same"))
    assert not mismatches, json.dumps(mismatches[:3], indent=1)[:6000]
    assert compared >= len(SEEDS) // 2, report["outcomes"]
    assert keys >= compared // 2, f"cuDNN's keys compared for only {keys} graphs"
    assert {f for (f, o) in outcome if o == "the same"} == set(FAMILIES), report["outcomes"]


def test_the_recorded_catalog_is_the_installed_frontends(frontend: Any) -> None:
    from tests.support.scripts import load_script

    derive = load_script("frontend_api").derive

    assert derive() == json.loads(RECORDED.read_text()), (
        "the GPU machine's frontend differs from the recorded list: run scripts/frontend-catalog.py"
    )
