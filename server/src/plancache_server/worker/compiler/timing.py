"""Timing candidate plans on the GPU, to pick the fastest (worker only).

Two strategies, with the same goal: the candidate with the lowest GPU time.

- `exhaustive` times every candidate precisely: replays of a CUDA graph of
  several executions (a plan runs in microseconds while one execute costs
  ~15 us of host time, so a launch loop would time the host: on an H200
  every matmul candidate read 14-17 us eagerly, 3.4-7.1 us from replays),
  7 event-timed batches of >= 1 ms each.
- `screened` (the default) captures each candidate once into a CUDA graph
  (without torch.cuda.graph's context, which empties the caching allocator
  on every capture) of as many executions as make ~0.2 ms, and times one
  replay: a screen of GPU time alone, cheap next to the candidate's first
  execution (where CUDA loads its kernels). Only the candidates within
  SCREEN_MARGIN of the best screen are then timed precisely from replays of
  the same graph, stopping after 3 batches when they agree within 2%.
  Candidates that cannot be captured are timed eagerly and never screened
  out: an eager time cannot be compared with GPU times (a first version
  screened eagerly and dropped near-best plans whose launches cost ~60 us of
  host time: docs/gpu-runs/2026-11-30-h200-run12.md).

bench/autotune.py runs both on the same graphs, fresh processes each, and
compares the cost per candidate and the chosen plans' times.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cudnn
import torch

from plancache_server.settings import AUTOTUNE_STRATEGIES

log = logging.getLogger(__name__)

# One timed batch spans at least this long: launch overhead and event
# resolution stay small against it.
MIN_BATCH_MS = 1.0
EXHAUSTIVE_REPEATS = 7
# Adaptive repeats of the precise pass: stop at the first count whose
# samples agree within SETTLED_SPREAD.
ADAPTIVE_REPEATS = (3, 5, 7)
SETTLED_SPREAD = 1.02
# Executions captured per CUDA graph (the exhaustive strategy; the screen
# captures up to this many, as many as make SCREEN_GRAPH_MS).
LAUNCHES_PER_GRAPH = 10
SCREEN_GRAPH_MS = 0.2
SCREEN_MARGIN = 1.25
# Candidates within this of the best precise time are timed again side by
# side, FINAL_ROUNDS rounds of one batch each, in turn: timed one after the
# other, a 25 us convolution's candidates drifted apart by 3% (GPU run 19:
# the screened pick 1.03x the exhaustive one on two convolutions).
FINAL_MARGIN = 1.05
FINAL_ROUNDS = 7


@dataclass(frozen=True)
class Timed:
    index: int
    ms: float | None  # None: it failed
    method: str = ""  # "cuda-graph", "eager" (not capturable), "screen" (one replay; dropped after the screen)
    error: str = ""


def time_candidates(
    launches: Sequence[Callable[[], None]], handle: object, device: torch.device, strategy: str = "screened"
) -> list[Timed]:
    """Every candidate's time, in index order. `launches[i]()` executes candidate i."""
    if strategy not in AUTOTUNE_STRATEGIES:
        raise ValueError(f"autotune strategy {strategy!r}: expected one of {', '.join(AUTOTUNE_STRATEGIES)}")
    timer = _Timer(handle, device)
    if strategy == "exhaustive":
        return [timer.guarded(i, launch, timer.legacy_precise) for i, launch in enumerate(launches)]
    screened = [timer.guarded(i, launch, functools.partial(timer.screen, i)) for i, launch in enumerate(launches)]
    gpu_times = [t.ms for t in screened if t.ms is not None and t.method == "screen"]
    cutoff = min(gpu_times) * SCREEN_MARGIN if gpu_times else math.inf
    results = []
    for t in screened:
        if t.ms is None or t.method != "screen":
            results.append(t)  # failed, or timed eagerly already (not capturable)
        elif t.ms > cutoff:
            timer.forget(t.index)
            results.append(t)  # clearly slower: its screen time is its record
        else:
            results.append(timer.guarded(t.index, launches[t.index], functools.partial(timer.precise, t.index)))
    return timer.final_round(results)


def best(results: Sequence[Timed]) -> Timed | None:
    """The fastest precisely timed candidate (screened-out ones never win)."""
    finalists = [t for t in results if t.ms is not None and t.method != "screen"]
    return min(finalists, key=lambda t: t.ms or math.inf, default=None)


class _Timer:
    def __init__(self, handle: object, device: torch.device) -> None:
        self._handle = handle
        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, int]] = {}  # screened, not yet timed precisely

    def guarded(
        self, index: int, launch: Callable[[], None], method: Callable[[Callable[[], None]], tuple[float, str]]
    ) -> Timed:
        try:
            ms, how = method(launch)
        except Exception as e:  # a candidate that fails is recorded, not fatal
            self._restore_stream()
            return Timed(index, None, error=f"{type(e).__name__}: {str(e)[:300]}")
        return Timed(index, ms, how)

    # ---- the passes ---------------------------------------------------------------

    def screen(self, index: int, launch: Callable[[], None]) -> tuple[float, str]:
        """One eager execution (a failing plan fails here; CUDA loads its
        kernels here), then the GPU time of one replay of a captured graph,
        kept for the precise pass; eager timing if it cannot be captured."""
        launch()
        torch.cuda.synchronize(self._device)
        eager_ms = self._batch(launch, 1)  # an upper bound (host time included): sizes the graph
        count = min(LAUNCHES_PER_GRAPH, max(1, math.ceil(SCREEN_GRAPH_MS / max(eager_ms, 1e-3))))
        graph = self._capture(launch, count)
        if graph is None:
            return self._adaptive(launch), "eager"
        graph.replay()  # the first replay uploads the graph
        self._graphs[index] = (graph, count)
        return self._batch(graph.replay, 1) / count, "screen"

    def precise(self, index: int, launch: Callable[[], None]) -> tuple[float, str]:
        """GPU ms per execution from replays of the screen's graph, adaptive
        repeats (the graph is kept for the final round)."""
        graph, count = self._graphs[index]
        return self._adaptive(graph.replay) / count, "cuda-graph"

    def final_round(self, results: list[Timed]) -> list[Timed]:
        """The close finalists timed again in turn (a batch of each per
        round, the order rotated), their medians replacing their times; every
        graph kept for it is freed after."""
        try:
            timed = [t for t in results if t.ms is not None and t.method == "cuda-graph" and t.index in self._graphs]
            if len(timed) < 2:
                return results
            best = min(t.ms or math.inf for t in timed)
            finalists = [t.index for t in timed if (t.ms or math.inf) <= best * FINAL_MARGIN]
            if len(finalists) < 2:
                return results
            sizes = {i: self._batch_size(self._graphs[i][0].replay) for i in finalists}
            samples: dict[int, list[float]] = {i: [] for i in finalists}
            for round_ in range(FINAL_ROUNDS):
                order = finalists[round_ % len(finalists) :] + finalists[: round_ % len(finalists)]
                for i in order:
                    graph, count = self._graphs[i]
                    samples[i].append(self._batch(graph.replay, sizes[i]) / count)
            medians = {i: float(statistics.median(v)) for i, v in samples.items()}
            return [Timed(t.index, medians[t.index], "interleaved") if t.index in medians else t for t in results]
        except Exception as e:  # the precise times stand
            log.warning("final round of timing failed (%s); keeping the precise times", e)
            self._restore_stream()
            return results
        finally:
            self._graphs.clear()

    def forget(self, index: int) -> None:
        self._graphs.pop(index, None)

    def legacy_precise(self, launch: Callable[[], None]) -> tuple[float, str]:
        """The exhaustive strategy's timing, as the product did before the
        screen: torch.cuda.graph capture, 7 batches."""
        launch()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            cudnn.set_stream(self._handle, self._stream.cuda_stream)
            with torch.cuda.graph(graph, stream=self._stream):
                for _ in range(LAUNCHES_PER_GRAPH):
                    launch()
        except Exception as e:
            log.debug("plan not capturable (%s); timing eagerly", e)
            self._restore_stream()
            torch.cuda.synchronize()
            return self._repeated(launch, EXHAUSTIVE_REPEATS), "eager"
        self._restore_stream()
        try:
            return self._repeated(graph.replay, EXHAUSTIVE_REPEATS) / LAUNCHES_PER_GRAPH, "cuda-graph"
        finally:
            del graph

    # ---- pieces -------------------------------------------------------------------

    def _capture(self, launch: Callable[[], None], count: int) -> torch.cuda.CUDAGraph | None:
        torch.cuda.synchronize(self._device)
        graph = torch.cuda.CUDAGraph()
        cudnn.set_stream(self._handle, self._stream.cuda_stream)
        try:
            with torch.cuda.stream(self._stream):
                graph.capture_begin()
                try:
                    for _ in range(count):
                        launch()
                finally:
                    graph.capture_end()
        except Exception as e:
            log.debug("plan not capturable (%s); timing eagerly", e)
            return None
        finally:
            self._restore_stream()
        return graph

    def _restore_stream(self) -> None:
        cudnn.set_stream(self._handle, torch.cuda.current_stream(self._device).cuda_stream)

    def _batch(self, launch: Callable[[], None], count: int) -> float:
        self._start.record()
        for _ in range(count):
            launch()
        self._end.record()
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / count

    def _batch_size(self, launch: Callable[[], None]) -> int:
        """Launches per batch so that one batch spans MIN_BATCH_MS."""
        for _ in range(2):
            launch()
        estimate = max(self._batch(launch, 3), 1e-4)
        return min(max(math.ceil(MIN_BATCH_MS / estimate), 3), 500)

    def _adaptive(self, launch: Callable[[], None]) -> float:
        size = self._batch_size(launch)
        samples: list[float] = []
        for count in ADAPTIVE_REPEATS:
            while len(samples) < count:
                samples.append(self._batch(launch, size))
            if max(samples) <= min(samples) * SETTLED_SPREAD:
                break
        return float(statistics.median(samples))

    def _repeated(self, launch: Callable[[], None], repeats: int) -> float:
        for _ in range(3):
            launch()
        torch.cuda.synchronize()
        self._start.record()
        for _ in range(5):
            launch()
        self._end.record()
        self._end.synchronize()
        size = min(max(math.ceil(MIN_BATCH_MS / max(self._start.elapsed_time(self._end) / 5, 1e-4)), 3), 500)
        return float(statistics.median(self._batch(launch, size) for _ in range(repeats)))
