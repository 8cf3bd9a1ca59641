"""The builds a worker holds: each one's record (its job, its pieces as they
come back) and the set of them, whose leases the worker's heartbeat renews."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from plancache_server.store.jobs import Delivery, Job
from plancache_server.worker.build_tasks import task_query
from plancache_server.worker.compiler.base import BuiltPlan, Heuristic
from plancache_server.worker.lanes import Lane
from plancache_server.worker.verified_job import VerifiedJob
from plancache_server.worker.warm_runner import WarmRef

# Acceptance order: older builds' candidates go first (plancache_server.worker.lanes).
_accepted = itertools.count()


@dataclass(eq=False)
class Build:
    """A job being built: its pieces, as they come back."""

    delivery: Delivery | None  # None for warming (no job in a stream)
    job: Job
    verified: VerifiedJob
    warm: WarmRef | None = None  # a warming item, until a caller asks for it (then it is promoted)
    seq: int = field(default_factory=lambda: next(_accepted))
    query: bytes = field(init=False)  # what its build tasks carry: its verified query's wire form
    started: float = field(default_factory=time.monotonic)
    heuristic: Heuristic | None = None
    waiting: set[int] = field(default_factory=set)  # candidates not back yet
    built: list[BuiltPlan] = field(default_factory=list)
    failed: list[BuiltPlan] = field(default_factory=list)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    promoted: list[Delivery] = field(default_factory=list)  # callers' jobs for the same plan, acknowledged with it

    def __post_init__(self) -> None:
        self.query = task_query(self.verified.query)

    @property
    def key(self) -> str:
        return self.delivery.entry_id if self.delivery is not None else self.job.job_id

    @property
    def warming(self) -> bool:
        """A warming item no caller has asked for yet."""
        return self.warm is not None and not self.promoted

    @property
    def yielding(self) -> bool:
        """Only callers that build the plan themselves asked for it (Job.yields), and no caller that waits for
        it since (a hurry is a promotion)."""
        return self.job.yields and self.warm is None and not self.promoted

    @property
    def lanes(self) -> tuple[Lane, Lane]:
        """(heuristic, candidate) lanes of its tasks."""
        if self.warming:
            return (Lane.WARM_HEURISTIC, Lane.WARM_CANDIDATE)
        return (Lane.YIELDING if self.yielding else Lane.HEURISTIC, Lane.CANDIDATE)

    @property
    def deliveries(self) -> list[Delivery]:
        """The stream entries it answers: its own job's, and those of callers' jobs promoted onto it."""
        return [d for d in (self.delivery, *self.promoted) if d is not None]


class HeldBuilds:
    """The builds a worker holds (building, or waiting for their autotuning),
    by build key. Only the worker's loop changes them; its heartbeat thread
    reads a copy (`snapshot`)."""

    def __init__(self) -> None:
        self._builds: dict[str, Build] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._builds)

    def holds(self, build: Build) -> bool:
        """False once it was let go (its pieces still queued are dropped)."""
        return build.key in self._builds

    def add(self, build: Build) -> None:
        with self._lock:
            self._builds[build.key] = build

    def forget(self, build: Build) -> None:
        with self._lock:
            self._builds.pop(build.key, None)

    def all(self) -> list[Build]:
        return list(self._builds.values())

    def snapshot(self) -> list[Build]:
        """All of them, for another thread."""
        with self._lock:
            return list(self._builds.values())

    def warming(self) -> list[Build]:
        """Warming items no caller has asked for yet."""
        return [b for b in self._builds.values() if b.warming]

    def joined_by(self, job: Job) -> Build | None:
        """The build a caller's `job` joins, if one is held: the warm build of its plan (promoted or not), or
        the build of the same job (queued again to hurry it: plancache_server.gateway.flight.Flight.hurry)."""
        return next(
            (
                b
                for b in self._builds.values()
                if (b.warm is not None and b.job.plan_key == job.plan_key) or b.job.job_id == job.job_id
            ),
            None,
        )
