"""bench/torch_models.py's compiled variants: torch's model and plancache's each compiled through an entry of its
own, so that neither call tries the other's compiled code first (dynamo keeps compiled code by code object)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the benchmark's runners need torch (make test installs its CPU build)")

from bench.torch_models import _own_entry  # noqa: E402


def test_two_copies_of_one_model_class_each_keep_one_compiled_entry_of_their_own() -> None:
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list as entries

    compiled: list[Any] = []

    def counting(gm: Any, example: Any) -> Any:
        compiled.append(gm)
        return gm.forward

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    torch._dynamo.reset()
    own = {variant: _own_entry(copy.deepcopy(model), variant) for variant in ("torch", "plancache")}
    runs = {variant: torch.compile(entry, backend=counting, fullgraph=True) for variant, entry in own.items()}
    for _ in range(3):
        for run in runs.values():
            torch.testing.assert_close(run(x), model(x))
    assert len(compiled) == 2  # one compile each, none again
    # Each entry's code holds its variant's compiled code alone. torch.compile of the modules themselves compiles one
    # code object shared by both (torch 2.13: dynamo's wrapper of every compiled module), its entries tried in turn.
    assert all(len(entries(entry.__code__)) == 1 for entry in own.values())
