"""STAND-IN for a node's own build of a hedged miss (never used by the
product): what plancache.transport.hedge.FrontendBuilder does with the cuDNN
frontend, played without a GPU. It sleeps `seconds` (the build), then
answers a LocalPlan whose graph records what it runs, or fails as cuDNN
would refuse the graph. The real local build runs on the GPU
(tests/gpu/test_gpu_hedge.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from plancache.errors import CompileFailed
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.run.local import LocalGraph, LocalPlan, local_build
from plancache.run.plan import Plan
from plancache.trust.answers import satisfies
from plancache.wire.metadata import plan_metadata
from tests.support.standin import STANDIN_TARGET

LOCAL_WORKSPACE = 128


@dataclass
class StandInLocalGraph:
    """The frontend graph a local build leaves: records each execute_plan_at_index."""

    calls: list[tuple[dict[int, Any], Any, int, Any]] = field(default_factory=list)

    def execute_plan_at_index(self, pack: dict[int, Any], workspace: Any, index: int, handle: Any = None) -> None:
        self.calls.append((dict(pack), workspace, index, handle))


class StandInLocalBuilder:
    """`seconds`: how long a build takes; `fail`: every build raises
    CompileFailed; `machine`: the target a build here makes plans for."""

    def __init__(self, seconds: float = 0.0, fail: bool = False, machine: Target = STANDIN_TARGET) -> None:
        self.seconds, self.fail, self.machine = seconds, fail, machine
        self.built: list[str] = []  # keys, in the order builds started
        self.graphs: list[StandInLocalGraph] = []
        self.threads: list[int] = []  # the thread each build ran on
        self.lock = threading.Lock()
        self._answers: dict[str, bool] = {}

    def can_build(self, target: Target) -> bool:
        """Answered once per target, as FrontendBuilder does (it sits on every hedged compile's path)."""
        found = self._answers.get(target.id)
        if found is None:
            found = self._answers[target.id] = satisfies(self.machine, target)
        return found

    def build(self, query: PlanQuery) -> Plan:
        with self.lock:
            self.built.append(query.key)
            self.threads.append(threading.get_ident())
        time.sleep(self.seconds)
        if self.fail:
            raise CompileFailed("stand-in: cuDNN refuses this graph on this node too")
        graph = StandInLocalGraph()
        self.graphs.append(graph)
        return LocalPlan(
            LocalGraph(graph, 0),
            plan_metadata(query, local_build(query, {}, LOCAL_WORKSPACE, "standin-local", self.seconds)),
            0,
        )
