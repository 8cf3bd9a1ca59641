"""How a worker takes warming items (plancache_server.worker.warm_runner)
into its lowest lanes, so that warming never holds up a caller's plan."""

from __future__ import annotations

from collections.abc import Callable

from plancache.errors import InvalidRequest
from plancache.keys.target import Target
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store.build_records import BuildRecorder
from plancache_server.store.plans import RedisPlanStore
from plancache_server.store.warming import FAILED, SKIPPED, WARM_JOB_PREFIX, WarmItem
from plancache_server.worker.held_builds import Build, HeldBuilds
from plancache_server.worker.lanes import Lane, Lanes
from plancache_server.worker.verified_job import verify_job
from plancache_server.worker.warm_runner import WarmRef, WarmRunner
from plancache_server.worker.worker_log import log

# Warming items one turn of the loop may take that need no build (stored already, refused).
WARM_ITEMS_PER_TURN = 64
# Warm builds a worker holds at once: most wait for their candidates, the lowest lane
# (bench/upgrade.py: at 64 the rollout's autotunings kept warming from going on).
MAX_WARM_BUILDS = 512


class WarmIntake:
    """The warming items of a worker (`worker_id`) with `pool_size` build
    processes, for the targets it serves."""

    def __init__(
        self,
        runner: WarmRunner,
        store: RedisPlanStore,
        builds: BuildRecorder,
        worker_id: str,
        targets: list[Target],
        pool_size: int,
        beside_callers: int = 0,
    ) -> None:
        self._runner = runner
        self._store = store
        self._builds = builds
        self._worker_id = worker_id
        self._targets = targets
        self._pool_size = pool_size
        self._beside_callers = beside_callers

    def take(self, lanes: Lanes, held: HeldBuilds, callers: int, start: Callable[[Build], None]) -> None:
        """Take warming items: one warm heuristic plan queued at a time (it
        goes before the candidates of autotunings, which would otherwise keep
        warming from ever starting during a rollout), fewer in their
        heuristic phase than there are build processes past the first, and at
        most MAX_WARM_BUILDS held (those waiting for their candidates, the
        lowest lane, included). While `callers` heuristic plans of callers
        wait or build, at most `beside_callers` in their heuristic phase, and
        none that would leave a caller's plan without a process. Items that
        need no build (stored, refused) are recorded and the next one taken
        at once; `start` starts a build."""
        limit = max(1, self._pool_size - 1)
        if callers:
            limit = min(self._beside_callers, self._pool_size - 1 - callers)
            if limit <= 0:
                self._runner.busy()
                return
        for _ in range(WARM_ITEMS_PER_TURN):
            warm = held.warming()
            first_phase = sum(1 for b in warm if b.heuristic is None)
            queued = lanes.count(Lane.WARM_HEURISTIC)
            if queued or first_phase >= limit or len(warm) >= MAX_WARM_BUILDS:
                return
            found = self._runner.next_item()
            if found is None or self._start(*found, start):
                return

    def _start(self, ref: WarmRef, item: WarmItem, start: Callable[[Build], None]) -> bool:
        """True when a build started; False when the item needed none (recorded)."""
        job = item.job()
        try:
            verified = verify_job(job, self._targets)
        except InvalidRequest as e:  # a forged or damaged item: recorded, skipped
            self._runner.record(ref, FAILED, f"refused: {e.message}", item.plan_key)
            return False
        if self._runner.cancelled(ref, job.plan_key):
            self._runner.record(ref, SKIPPED, "its graph family was cancelled", job.plan_key)
            return False
        stored = self._store.get(job.plan_key)
        if stored is not None and not stored.metadata.provisional:
            self._runner.record(ref, SKIPPED, "already stored", job.plan_key)
            return False
        holder = self._builds.take_lease(job.plan_key, job.job_id)
        if holder is not None and holder.startswith(WARM_JOB_PREFIX):
            # Another warm build of it, maybe of a worker that died: its lease runs out (--build-lease).
            self._runner.defer(ref)
            return True
        if holder is not None:
            self._runner.record(ref, SKIPPED, "being built for a caller", job.plan_key)
            # A member a program met before warming reached it: what "soonest first" is measured by.
            log.info(
                "warming %s: item %d, plan %s: a caller's build has it (%s)",
                ref.target_id,
                ref.index,
                job.plan_key,
                graph_label(job.query.spec),
            )
            return False
        self._builds.mark_running(job.plan_key, job.job_id, self._worker_id)
        log.info(
            "warming %s: item %d, plan %s (%.0f recent hits of the source; %s)",
            ref.target_id,
            ref.index,
            job.plan_key,
            item.hits,
            graph_label(job.query.spec),
        )
        start(Build(None, job, verified, warm=ref))
        return True


def graph_label(spec: pb.GraphSpec) -> str:
    """What a log line says of a warming item's graph: its name and its first tensor's dims (for a graph
    family's member, the size it stands for)."""
    first = list(spec.tensors[0].dim) if spec.tensors else []
    return f"graph {spec.name or '(unnamed)'}, first tensor {first}"
