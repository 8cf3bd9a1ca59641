"""STAND-INS for CPU tests of plancache.cudnn and plancache.functional (never
used by the product): a plancache client that answers from memory, tensors
that carry only geometry (printing their dtype as torch does), the tensor
operations a served call makes, and the served graph of the frontend shim.
The numerics are GPU tests (tests/gpu/test_gpu_frontend_shim.py,
tests/gpu/test_gpu_functional.py)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plancache import CompileOptions, GraphSpec, NotFound, NotStored, Plan, PlanCacheError, Target
from plancache.graphspec.family import Family
from plancache.graphspec.layouts import row_major
from plancache.keys.plankey import make_family_key
from plancache.keys.query import PlanQuery
from plancache.run.local import LocalPlan
from plancache.transport.hedge import Raced
from plancache.transport.manifest import Manifest
from plancache.transport.results import FamilyStatus, PrefetchResult
from plancache_server.worker.compiler.base import CandidateResult, CompiledPlan
from plancache_server.worker.verified_job import VerifiedJob, plan_metadata
from tests.support.fake_gpu import FakeDevice

TARGET = Target("sm_90", 91900, "1.32.0", "StandIn GPU", 132)
_addresses = itertools.count(0x10000, 0x1000)


def key_of(spec: GraphSpec, target: Target = TARGET, options: CompileOptions | None = None) -> str:
    """The plan key a client asks for (plancache.trust.answers, as Client.compile computes it)."""
    return PlanQuery.of(spec, target, options).key


# The plan list a stand-in worker records: what plancache.cudnn answers a program's queries from.
STANDIN_PLAN_LIST = (
    CandidateResult(
        0, "eng0_standin", 0, 0.01, knobs={"SPLIT_K": 1}, behavior_notes=("RUNTIME_COMPILATION",), workspace_size=256
    ),
    CandidateResult(1, "eng7_standin", 7, None, knobs={"TILE_SIZE": 2}),
    CandidateResult(2, "eng9_standin", 9, None),
)


def plan_for(
    spec: GraphSpec,
    target: Target = TARGET,
    options: CompileOptions | None = None,
    source: str = "compiled",
    workspace: int = 256,
) -> Plan:
    """A plan answering `spec` with a made-up blob, its metadata as a worker
    writes it (plancache_server.worker.verified_job)."""
    query = PlanQuery.of(spec, target, options)
    blob = b"standin-plan:" + query.spec_hash.encode()
    compiled = CompiledPlan(
        blob, workspace, 0, {}, "standin", is_python_engine=False, candidates=list(STANDIN_PLAN_LIST)
    )
    metadata = plan_metadata(VerifiedJob(query), compiled, "standin-worker", target.to_proto())
    metadata.blob_sha256 = hashlib.sha256(blob).hexdigest()
    return Plan(blob, metadata, source)


def _asked(
    spec: GraphSpec | PlanQuery, target: Target | str | None, options: CompileOptions | None
) -> tuple[GraphSpec, Target, CompileOptions | None]:
    """What a call asks for, as the front doors say it (a PlanQuery) or a program does (spec, target, options)."""
    if isinstance(spec, PlanQuery):
        assert target is None and options is None
        return spec.spec, spec.target, spec.options
    assert isinstance(target, Target)
    return spec, target, options


@dataclass
class StandInClient:
    """A plancache.Client stand-in: `compile` records what it was asked and
    answers with a plan for the spec, or raises `error`."""

    error: PlanCacheError | None = None
    source: str = "compiled"
    asked: list[tuple[GraphSpec, Target, CompileOptions]] = field(default_factory=list)
    hedge: bool = False
    # With `hedge`, how a race ends: "local" (the caller's build ran first; `pending` is the
    # service's side, to answer later) or "service" (the caller's build ran, the plan came first).
    race_outcome: str = "local"
    pending: StandInRace | None = None
    # compile() answers as a hedged Client whose own build won: a LocalPlan, the service's plan in `pending`.
    local_plans: bool = False
    prefetched: list[str] = field(default_factory=list)  # plan keys prefetch() was asked for
    families: list[tuple[Family, Target, CompileOptions | None]] = field(default_factory=list)  # build_family() calls
    families_seen: list[dict[str, Sequence[int]]] = field(default_factory=list)  # build_family()'s `seen`
    family_error: PlanCacheError | None = None  # what build_family() raises
    not_stored: set[str] = field(default_factory=set)  # plan keys prefetch() answers NotFound
    asked_first: list[str] = field(default_factory=list)  # ask_first() calls' plan keys
    # compile(stored_only=True) with `starts_empty`: a plan key not in `stored` is NotStored, and stored from then
    # on (the service builds what it was asked for); `asked_stored_only`: every key asked so.
    starts_empty: bool = False
    stored: set[str] = field(default_factory=set)
    asked_stored_only: list[str] = field(default_factory=list)

    def ask_first(self, key: str) -> None:
        self.asked_first.append(key)

    def compile(
        self,
        spec: GraphSpec | PlanQuery,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        timeout: float | None = None,
        hedge: bool | None = None,
        hedge_path: str = "compile",
        stored_only: bool = False,
    ) -> Plan:
        spec, target, options = _asked(spec, target, options)
        self.asked.append((spec, target, options or CompileOptions()))
        if self.error is not None:
            raise self.error
        if stored_only:
            key = key_of(spec, target, options)
            self.asked_stored_only.append(key)
            if self.starts_empty and key not in self.stored:
                self.stored.add(key)
                raise NotStored(f"plan {key} is not stored yet: the service is building it")
        if self.local_plans:
            from tests.support.standin_local import StandInLocalBuilder

            local = StandInLocalBuilder().build(PlanQuery.of(spec, target, options))
            assert isinstance(local, LocalPlan)
            self.pending = StandInRace(plan_for(spec, target, options, self.source))
            local.replace_with(self.pending)
            return local
        return plan_for(spec, target, options, self.source)

    def race(
        self,
        spec: GraphSpec | PlanQuery,
        target: Target | str | None,
        options: CompileOptions | None,
        build: Callable[[], Any],
        *,
        path: str,
        timeout: float | None = None,
    ) -> Raced[Any]:
        spec, target, options = _asked(spec, target, options)
        self.asked.append((spec, target, options or CompileOptions()))
        if self.error is not None:
            raise self.error
        build()
        if self.race_outcome == "service":
            return Raced(plan=plan_for(spec, target, options, self.source))
        self.pending = StandInRace(plan_for(spec, target, options, self.source))
        return Raced(local=None, race=self.pending, key=key_of(spec, target, options))  # type: ignore[arg-type]

    @property
    def admin(self) -> StandInClient:
        """An operator's calls (AdminClient's: build_family) are this stand-in's too."""
        return self

    def prefetch(
        self,
        manifest: Manifest,
        target: Target | str | None = None,
        *,
        compile_missing: bool = False,
        timeout: float | None = None,
        on_plan: Callable[[int, Plan], None] | None = None,
        **_: Any,
    ) -> PrefetchResult:
        """Client.prefetch: each entry's stored plan ("hit"), or NotFound for keys in `not_stored`."""
        assert isinstance(target, Target)
        result = PrefetchResult(total=len(manifest.entries))
        for index, entry in enumerate(manifest.entries):
            key = result.keys[index] = manifest.key_of(entry, target)
            self.prefetched.append(key)
            if key in self.not_stored or entry.spec is None:
                result.errors[index] = NotFound(f"no stored plan {key}")
                continue
            plan = result.plans[index] = plan_for(entry.spec, target, manifest.options, "hit")
            if on_plan is not None:
                on_plan(index, plan)
        return result

    def build_family(
        self,
        family: Family,
        target: Target | str | None = None,
        options: CompileOptions | None = None,
        *,
        seen: Mapping[str, Sequence[int]] | None = None,
        **_: Any,
    ) -> FamilyStatus:
        """Client.build_family: recorded (and the sizes seen it was given); every graph queued (or `error`)."""
        assert isinstance(target, Target)
        if self.family_error is not None:
            raise self.family_error
        self.families.append((family, target, options))
        self.families_seen.append(dict(seen or {}))
        return FamilyStatus(
            make_family_key(family.family_hash(), target, options or CompileOptions()),
            target.id,
            family.size(),
            0,
            family.size(),
            0.0,
        )

    def close(self) -> None:
        pass


class StandInRace:
    """The service's side of a race the caller's build won: answers when the test says (`answer()`)."""

    def __init__(self, plan: Plan) -> None:
        self._plan, self.answered, self.adoptions = plan, False, 0

    def answer(self) -> None:
        self.answered = True

    def done(self) -> bool:
        return self.answered

    @property
    def plan(self) -> Plan | None:
        return self._plan if self.answered else None

    def adopted(self) -> None:
        self.adoptions += 1


# ---- tensors ------------------------------------------------------------------------


@dataclass(frozen=True)
class StandInDtype:
    name: str  # torch's name: float16, bfloat16, float32, int32, bool

    def __str__(self) -> str:
        return f"torch.{self.name}"


DTYPES = {n: StandInDtype(n) for n in ("float16", "bfloat16", "float32", "float64", "int32", "int64", "bool")}


class StandInTensor:
    """Geometry only: shape, stride(), dtype, device, get_device(), requires_grad."""

    def __init__(
        self,
        shape: tuple[int, ...],
        stride: tuple[int, ...] | None = None,
        dtype: str = "float16",
        device: str = "cuda:0",
        requires_grad: bool = False,
    ) -> None:
        self.shape = tuple(shape)
        self._stride = tuple(stride) if stride is not None else row_major(self.shape)
        self.dtype = DTYPES[dtype]
        kind, _, index = device.partition(":")
        self.device = FakeDevice(kind, int(index) if index else None)
        self.requires_grad = requires_grad
        self.value: float | None = None  # a constant's fill
        self._ptr = next(_addresses)

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def get_device(self) -> int:
        return -1 if self.device.type == "cpu" else (self.device.index or 0)

    def data_ptr(self) -> int:
        return self._ptr

    def view(self, *shape: Any) -> StandInTensor:
        """torch's view of a dense tensor: the same memory, other dims."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        assert math.prod(dims) == math.prod(self.shape) and self._stride == row_major(self.shape), (self, dims)
        viewed = StandInTensor(dims, None, self.dtype.name, str(self.device), self.requires_grad)
        viewed._ptr, viewed.base = self._ptr, self
        return viewed

    def to(self, dtype: Any) -> StandInTensor:
        """torch's cast: a new tensor of `dtype` (itself when it already is)."""
        if dtype == self.dtype:
            return self
        return StandInTensor(self.shape, None, dtype.name, str(self.device), self.requires_grad)

    def __repr__(self) -> str:
        return f"StandInTensor({self.shape}, {self._stride}, {self.dtype}, {self.device})"


_TORCH_NAMES = {"half": "float16", "bfloat16": "bfloat16", "float": "float32", "int32": "int32", "int64": "int64"}


class StandInOps:
    """plancache.functional's tensor operations (outputs, constants, device) on stand-in tensors."""

    def __init__(self) -> None:
        self.outputs: list[StandInTensor] = []
        self.constants: list[StandInTensor] = []
        self.device = 0
        self.capturing_graph = False  # as torch.cuda.is_current_stream_capturing()
        self.race_log: list[tuple[str, Any]] = []
        self.on_gradients: Callable[[Any, Any], None] | None = None  # a test's backward (recording.backward)

    def allocator(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        def make() -> StandInTensor:
            out = StandInTensor(shape, stride, _TORCH_NAMES[dtype], f"cuda:{device}")
            self.outputs.append(out)
            return out

        return make

    def constant(self, constant: Any, device: int) -> Any:
        t = StandInTensor(
            constant.shape, None, _TORCH_NAMES[constant.dtype], "cpu" if constant.on_host else f"cuda:{device}"
        )
        t.value = constant.value
        self.constants.append(t)
        return t

    def current_device(self) -> Callable[[], int]:
        return lambda: self.device

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        previous, self.device = self.device, device
        try:
            yield
        finally:
            self.device = previous

    def capturing(self) -> bool:
        return self.capturing_graph

    # plancache.functional._race's, recorded: what a race did, in order ("sync", "leaves", "grad").
    def synchronize(self, device: int) -> None:
        self.race_log.append(("sync", device))

    def device_seconds(self, run: Callable[[], None], runs: int, device: int, hold_s: float) -> float | None:
        """No device to hold: None (the race then takes each round's time as the device's); recorded."""
        self.race_log.append(("device", runs))
        return None

    def no_grad_unless(self, needs_grad: bool) -> contextlib.AbstractContextManager[None]:
        self.race_log.append(("grad mode", needs_grad))
        return contextlib.nullcontext()

    def leaves(self, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
        """The tensors themselves, as stand-ins have no history to take off; recorded."""
        self.race_log.append(("leaves", tensors))
        return tensors

    def random_like(self, tensor: Any) -> Any:
        return StandInTensor(tensor.shape, tensor.stride(), tensor.dtype.name, str(tensor.device))

    def gradients(self, result: Any, leaves: tuple[Any, ...], grad: Any) -> None:
        self.race_log.append(("grad", result))
        if self.on_gradients is not None:
            self.on_gradients(result, grad)


# ---- the frontend shim's served graph -------------------------------------------------


@dataclass
class StandInServedGraph:
    """What plancache.cudnn deserializes a served plan into, recording its calls."""

    blob: bytes
    workspace: int = 4096
    executed: list[tuple[dict[Any, Any], Any, Any]] = field(default_factory=list)

    def execute(self, pack: Any, workspace: Any = None, handle: Any = None, *args: Any, **kwargs: Any) -> None:
        self.executed.append((dict(pack), workspace, handle))

    def get_workspace_size(self, *args: Any, **kwargs: Any) -> int:
        return self.workspace
