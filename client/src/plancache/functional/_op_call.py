"""How plancache's torch operators (plancache.torch) call a function's geometry.

A torch operator is called below autograd (its backward is an operator of
its own) and, under torch.compile, from a compiled program where grad mode
says nothing about the model: so it says which form it wants (`train`), and
takes back plain tensors rather than an autograd.Function's output. The
geometry's key, table entry and first call are the function's own
(plancache.functional's modules take `op=`): the same plans serve both.
"""

from __future__ import annotations

from typing import Any

from plancache.functional._autograd import Differentiable
from plancache.functional._table import Fallback, Racing


class OpCall:
    """`train`: the geometry's training form (its forward writes what the
    backward reads); `resolve`: the entry itself, nothing run (a backward
    operator runs the entry's rule)."""

    __slots__ = ("resolve", "train")

    def __init__(self, train: bool, *, resolve: bool = False) -> None:
        self.train, self.resolve = train, resolve

    def take(self, entry: Any, tensors: tuple[Any, ...]) -> Any:
        """What a call of `entry` gives the operator: the entry (resolve), None
        where torch runs the geometry (the operator calls torch's function
        itself), every output of a training forward, or an inference's result."""
        if isinstance(entry, Racing):  # an operator's call is not raced: the plan's entry runs it
            entry = entry.inner
        if self.resolve:
            return entry
        if isinstance(entry, Fallback):
            entry.taken()
            return None
        if isinstance(entry, Differentiable):
            return entry.forward.outputs(tensors)
        return entry(tensors)


INFERENCE = OpCall(False)
TRAINING = OpCall(True)
BACKWARD = OpCall(True, resolve=True)
