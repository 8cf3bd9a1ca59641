import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_TYPE_UNSPECIFIED: _ClassVar[DataType]
    DATA_TYPE_FLOAT: _ClassVar[DataType]
    DATA_TYPE_HALF: _ClassVar[DataType]
    DATA_TYPE_BFLOAT16: _ClassVar[DataType]
    DATA_TYPE_DOUBLE: _ClassVar[DataType]
    DATA_TYPE_INT8: _ClassVar[DataType]
    DATA_TYPE_INT32: _ClassVar[DataType]
    DATA_TYPE_INT64: _ClassVar[DataType]
    DATA_TYPE_UINT8: _ClassVar[DataType]
    DATA_TYPE_BOOLEAN: _ClassVar[DataType]
    DATA_TYPE_FP8_E4M3: _ClassVar[DataType]
    DATA_TYPE_FP8_E5M2: _ClassVar[DataType]
    DATA_TYPE_INT8X4: _ClassVar[DataType]
    DATA_TYPE_UINT8X4: _ClassVar[DataType]
    DATA_TYPE_INT8X32: _ClassVar[DataType]
    DATA_TYPE_FAST_FLOAT_FOR_FP8: _ClassVar[DataType]
    DATA_TYPE_FP8_E8M0: _ClassVar[DataType]
    DATA_TYPE_FP8_E5M3: _ClassVar[DataType]
    DATA_TYPE_FP4_E2M1: _ClassVar[DataType]
    DATA_TYPE_INT4: _ClassVar[DataType]

class EngineKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_KIND_UNSPECIFIED: _ClassVar[EngineKind]
    ENGINE_KIND_BACKEND: _ClassVar[EngineKind]
    ENGINE_KIND_PYTHON: _ClassVar[EngineKind]

class CompileSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPILE_SOURCE_UNSPECIFIED: _ClassVar[CompileSource]
    COMPILE_SOURCE_HIT: _ClassVar[CompileSource]
    COMPILE_SOURCE_COMPILED: _ClassVar[CompileSource]
    COMPILE_SOURCE_JOINED: _ClassVar[CompileSource]
    COMPILE_SOURCE_PROVISIONAL: _ClassVar[CompileSource]
    COMPILE_SOURCE_BUILDING: _ClassVar[CompileSource]

class GraphOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAPH_OUTCOME_UNSPECIFIED: _ClassVar[GraphOutcome]
    GRAPH_OUTCOME_SERVED: _ClassVar[GraphOutcome]
    GRAPH_OUTCOME_DISK_CACHE: _ClassVar[GraphOutcome]
    GRAPH_OUTCOME_LOCAL: _ClassVar[GraphOutcome]

class RaceResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RACE_RESULT_UNSPECIFIED: _ClassVar[RaceResult]
    RACE_RESULT_LOCAL_WON: _ClassVar[RaceResult]
    RACE_RESULT_SERVICE_WON: _ClassVar[RaceResult]
    RACE_RESULT_LOCAL_FAILED: _ClassVar[RaceResult]
    RACE_RESULT_SERVICE_FAILED: _ClassVar[RaceResult]
    RACE_RESULT_REPLACED: _ClassVar[RaceResult]

class StreamVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_VERDICT_UNSPECIFIED: _ClassVar[StreamVerdict]
    STREAM_VERDICT_SERVED: _ClassVar[StreamVerdict]
    STREAM_VERDICT_MIXED: _ClassVar[StreamVerdict]

class SigningKeyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIGNING_KEY_STATE_UNSPECIFIED: _ClassVar[SigningKeyState]
    SIGNING_KEY_STATE_CURRENT: _ClassVar[SigningKeyState]
    SIGNING_KEY_STATE_NEXT: _ClassVar[SigningKeyState]
    SIGNING_KEY_STATE_PREVIOUS: _ClassVar[SigningKeyState]
DATA_TYPE_UNSPECIFIED: DataType
DATA_TYPE_FLOAT: DataType
DATA_TYPE_HALF: DataType
DATA_TYPE_BFLOAT16: DataType
DATA_TYPE_DOUBLE: DataType
DATA_TYPE_INT8: DataType
DATA_TYPE_INT32: DataType
DATA_TYPE_INT64: DataType
DATA_TYPE_UINT8: DataType
DATA_TYPE_BOOLEAN: DataType
DATA_TYPE_FP8_E4M3: DataType
DATA_TYPE_FP8_E5M2: DataType
DATA_TYPE_INT8X4: DataType
DATA_TYPE_UINT8X4: DataType
DATA_TYPE_INT8X32: DataType
DATA_TYPE_FAST_FLOAT_FOR_FP8: DataType
DATA_TYPE_FP8_E8M0: DataType
DATA_TYPE_FP8_E5M3: DataType
DATA_TYPE_FP4_E2M1: DataType
DATA_TYPE_INT4: DataType
ENGINE_KIND_UNSPECIFIED: EngineKind
ENGINE_KIND_BACKEND: EngineKind
ENGINE_KIND_PYTHON: EngineKind
COMPILE_SOURCE_UNSPECIFIED: CompileSource
COMPILE_SOURCE_HIT: CompileSource
COMPILE_SOURCE_COMPILED: CompileSource
COMPILE_SOURCE_JOINED: CompileSource
COMPILE_SOURCE_PROVISIONAL: CompileSource
COMPILE_SOURCE_BUILDING: CompileSource
GRAPH_OUTCOME_UNSPECIFIED: GraphOutcome
GRAPH_OUTCOME_SERVED: GraphOutcome
GRAPH_OUTCOME_DISK_CACHE: GraphOutcome
GRAPH_OUTCOME_LOCAL: GraphOutcome
RACE_RESULT_UNSPECIFIED: RaceResult
RACE_RESULT_LOCAL_WON: RaceResult
RACE_RESULT_SERVICE_WON: RaceResult
RACE_RESULT_LOCAL_FAILED: RaceResult
RACE_RESULT_SERVICE_FAILED: RaceResult
RACE_RESULT_REPLACED: RaceResult
STREAM_VERDICT_UNSPECIFIED: StreamVerdict
STREAM_VERDICT_SERVED: StreamVerdict
STREAM_VERDICT_MIXED: StreamVerdict
SIGNING_KEY_STATE_UNSPECIFIED: SigningKeyState
SIGNING_KEY_STATE_CURRENT: SigningKeyState
SIGNING_KEY_STATE_NEXT: SigningKeyState
SIGNING_KEY_STATE_PREVIOUS: SigningKeyState

class TensorSpec(_message.Message):
    __slots__ = ("uid", "name", "dim", "stride", "data_type", "is_virtual", "is_pass_by_value", "is_output", "scalar_value", "ragged_offset_uid", "reordering_type", "ragged_offset_multiplier", "alignment_value", "constant")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    IS_VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    IS_PASS_BY_VALUE_FIELD_NUMBER: _ClassVar[int]
    IS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SCALAR_VALUE_FIELD_NUMBER: _ClassVar[int]
    RAGGED_OFFSET_UID_FIELD_NUMBER: _ClassVar[int]
    REORDERING_TYPE_FIELD_NUMBER: _ClassVar[int]
    RAGGED_OFFSET_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_VALUE_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    uid: int
    name: str
    dim: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    data_type: DataType
    is_virtual: bool
    is_pass_by_value: bool
    is_output: bool
    scalar_value: float
    ragged_offset_uid: int
    reordering_type: str
    ragged_offset_multiplier: int
    alignment_value: int
    constant: ScalarConstant
    def __init__(self, uid: _Optional[int] = ..., name: _Optional[str] = ..., dim: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., data_type: _Optional[_Union[DataType, str]] = ..., is_virtual: _Optional[bool] = ..., is_pass_by_value: _Optional[bool] = ..., is_output: _Optional[bool] = ..., scalar_value: _Optional[float] = ..., ragged_offset_uid: _Optional[int] = ..., reordering_type: _Optional[str] = ..., ragged_offset_multiplier: _Optional[int] = ..., alignment_value: _Optional[int] = ..., constant: _Optional[_Union[ScalarConstant, _Mapping]] = ...) -> None: ...

class ScalarConstant(_message.Message):
    __slots__ = ("int_value", "float_value", "scalar_type")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    SCALAR_TYPE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    float_value: float
    scalar_type: str
    def __init__(self, int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., scalar_type: _Optional[str] = ...) -> None: ...

class IntList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("start", "stop", "step")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    step: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class SliceList(_message.Message):
    __slots__ = ("slices",)
    SLICES_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[Slice]
    def __init__(self, slices: _Optional[_Iterable[_Union[Slice, _Mapping]]] = ...) -> None: ...

class AttributeValue(_message.Message):
    __slots__ = ("int_value", "float_value", "bool_value", "string_value", "int_list", "slice_list", "subgraph")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_LIST_FIELD_NUMBER: _ClassVar[int]
    SLICE_LIST_FIELD_NUMBER: _ClassVar[int]
    SUBGRAPH_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    float_value: float
    bool_value: bool
    string_value: str
    int_list: IntList
    slice_list: SliceList
    subgraph: Subgraph
    def __init__(self, int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ..., int_list: _Optional[_Union[IntList, _Mapping]] = ..., slice_list: _Optional[_Union[SliceList, _Mapping]] = ..., subgraph: _Optional[_Union[Subgraph, _Mapping]] = ...) -> None: ...

class Subgraph(_message.Message):
    __slots__ = ("ops", "result")
    OPS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[SubgraphOp]
    result: SubgraphRef
    def __init__(self, ops: _Optional[_Iterable[_Union[SubgraphOp, _Mapping]]] = ..., result: _Optional[_Union[SubgraphRef, _Mapping]] = ...) -> None: ...

class SubgraphOp(_message.Message):
    __slots__ = ("op", "inputs", "attributes", "compute_data_type", "data_type", "name")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SubgraphRef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SubgraphRef, _Mapping]] = ...) -> None: ...
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttributeValue, _Mapping]] = ...) -> None: ...
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    op: str
    inputs: _containers.MessageMap[str, SubgraphRef]
    attributes: _containers.MessageMap[str, AttributeValue]
    compute_data_type: DataType
    data_type: DataType
    name: str
    def __init__(self, op: _Optional[str] = ..., inputs: _Optional[_Mapping[str, SubgraphRef]] = ..., attributes: _Optional[_Mapping[str, AttributeValue]] = ..., compute_data_type: _Optional[_Union[DataType, str]] = ..., data_type: _Optional[_Union[DataType, str]] = ..., name: _Optional[str] = ...) -> None: ...

class SubgraphRef(_message.Message):
    __slots__ = ("score", "result", "uid")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    score: bool
    result: int
    uid: int
    def __init__(self, score: _Optional[bool] = ..., result: _Optional[int] = ..., uid: _Optional[int] = ...) -> None: ...

class NodeSpec(_message.Message):
    __slots__ = ("name", "op", "inputs", "outputs", "attributes", "compute_data_type")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttributeValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    inputs: _containers.ScalarMap[str, int]
    outputs: _containers.ScalarMap[str, int]
    attributes: _containers.MessageMap[str, AttributeValue]
    compute_data_type: DataType
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Mapping[str, int]] = ..., outputs: _Optional[_Mapping[str, int]] = ..., attributes: _Optional[_Mapping[str, AttributeValue]] = ..., compute_data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class GraphSpec(_message.Message):
    __slots__ = ("io_data_type", "intermediate_data_type", "compute_data_type", "tensors", "nodes", "name", "sm_count", "sm_version", "is_dynamic_shape_enabled", "is_override_shape_enabled", "kernel_cache", "cuda_graph_retention", "is_cuda_graph_replay_expected")
    IO_DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    SM_VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_DYNAMIC_SHAPE_ENABLED_FIELD_NUMBER: _ClassVar[int]
    IS_OVERRIDE_SHAPE_ENABLED_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CACHE_FIELD_NUMBER: _ClassVar[int]
    CUDA_GRAPH_RETENTION_FIELD_NUMBER: _ClassVar[int]
    IS_CUDA_GRAPH_REPLAY_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    io_data_type: DataType
    intermediate_data_type: DataType
    compute_data_type: DataType
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSpec]
    name: str
    sm_count: int
    sm_version: int
    is_dynamic_shape_enabled: bool
    is_override_shape_enabled: bool
    kernel_cache: bool
    cuda_graph_retention: str
    is_cuda_graph_replay_expected: bool
    def __init__(self, io_data_type: _Optional[_Union[DataType, str]] = ..., intermediate_data_type: _Optional[_Union[DataType, str]] = ..., compute_data_type: _Optional[_Union[DataType, str]] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeSpec, _Mapping]]] = ..., name: _Optional[str] = ..., sm_count: _Optional[int] = ..., sm_version: _Optional[int] = ..., is_dynamic_shape_enabled: _Optional[bool] = ..., is_override_shape_enabled: _Optional[bool] = ..., kernel_cache: _Optional[bool] = ..., cuda_graph_retention: _Optional[str] = ..., is_cuda_graph_replay_expected: _Optional[bool] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("compute_capability", "cudnn_version", "frontend_version", "device_name", "sm_count")
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CUDNN_VERSION_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    compute_capability: str
    cudnn_version: int
    frontend_version: str
    device_name: str
    sm_count: int
    def __init__(self, compute_capability: _Optional[str] = ..., cudnn_version: _Optional[int] = ..., frontend_version: _Optional[str] = ..., device_name: _Optional[str] = ..., sm_count: _Optional[int] = ...) -> None: ...

class CompileOptions(_message.Message):
    __slots__ = ("autotune", "heuristic_modes", "workspace_limit", "excluded_behavior_notes", "pinned_plans", "pinned_only", "deselected_engines", "note_filters", "selected_plan")
    AUTOTUNE_FIELD_NUMBER: _ClassVar[int]
    HEURISTIC_MODES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_BEHAVIOR_NOTES_FIELD_NUMBER: _ClassVar[int]
    PINNED_PLANS_FIELD_NUMBER: _ClassVar[int]
    PINNED_ONLY_FIELD_NUMBER: _ClassVar[int]
    DESELECTED_ENGINES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FILTERS_FIELD_NUMBER: _ClassVar[int]
    SELECTED_PLAN_FIELD_NUMBER: _ClassVar[int]
    autotune: bool
    heuristic_modes: _containers.RepeatedScalarFieldContainer[str]
    workspace_limit: int
    excluded_behavior_notes: _containers.RepeatedScalarFieldContainer[str]
    pinned_plans: _containers.RepeatedCompositeFieldContainer[PinnedPlan]
    pinned_only: bool
    deselected_engines: _containers.RepeatedScalarFieldContainer[str]
    note_filters: _containers.RepeatedCompositeFieldContainer[NoteFilter]
    selected_plan: int
    def __init__(self, autotune: _Optional[bool] = ..., heuristic_modes: _Optional[_Iterable[str]] = ..., workspace_limit: _Optional[int] = ..., excluded_behavior_notes: _Optional[_Iterable[str]] = ..., pinned_plans: _Optional[_Iterable[_Union[PinnedPlan, _Mapping]]] = ..., pinned_only: _Optional[bool] = ..., deselected_engines: _Optional[_Iterable[str]] = ..., note_filters: _Optional[_Iterable[_Union[NoteFilter, _Mapping]]] = ..., selected_plan: _Optional[int] = ...) -> None: ...

class PinnedPlan(_message.Message):
    __slots__ = ("engine_id", "knobs")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    knobs: _containers.RepeatedCompositeFieldContainer[Knob]
    def __init__(self, engine_id: _Optional[int] = ..., knobs: _Optional[_Iterable[_Union[Knob, _Mapping]]] = ...) -> None: ...

class NoteFilter(_message.Message):
    __slots__ = ("kind", "keep", "notes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    keep: bool
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., keep: _Optional[bool] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class PlanRef(_message.Message):
    __slots__ = ("key", "query")
    KEY_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    key: str
    query: PlanQuery
    def __init__(self, key: _Optional[str] = ..., query: _Optional[_Union[PlanQuery, _Mapping]] = ...) -> None: ...

class PlanQuery(_message.Message):
    __slots__ = ("spec", "target", "options")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    spec: GraphSpec
    target: Target
    options: CompileOptions
    def __init__(self, spec: _Optional[_Union[GraphSpec, _Mapping]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., options: _Optional[_Union[CompileOptions, _Mapping]] = ...) -> None: ...

class TensorBinding(_message.Message):
    __slots__ = ("uid", "name", "dim", "stride", "data_type", "is_output", "is_pass_by_value", "scalar_value", "ragged_offset_uid")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    IS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    IS_PASS_BY_VALUE_FIELD_NUMBER: _ClassVar[int]
    SCALAR_VALUE_FIELD_NUMBER: _ClassVar[int]
    RAGGED_OFFSET_UID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    name: str
    dim: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    data_type: DataType
    is_output: bool
    is_pass_by_value: bool
    scalar_value: float
    ragged_offset_uid: int
    def __init__(self, uid: _Optional[int] = ..., name: _Optional[str] = ..., dim: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., data_type: _Optional[_Union[DataType, str]] = ..., is_output: _Optional[bool] = ..., is_pass_by_value: _Optional[bool] = ..., scalar_value: _Optional[float] = ..., ragged_offset_uid: _Optional[int] = ...) -> None: ...

class Knob(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class CandidateTiming(_message.Message):
    __slots__ = ("index", "plan_name", "engine_id", "median_ms", "error", "timing", "knobs", "behavior_notes", "workspace_size")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PLAN_NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_NOTES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SIZE_FIELD_NUMBER: _ClassVar[int]
    index: int
    plan_name: str
    engine_id: int
    median_ms: float
    error: str
    timing: str
    knobs: _containers.RepeatedCompositeFieldContainer[Knob]
    behavior_notes: _containers.RepeatedScalarFieldContainer[str]
    workspace_size: int
    def __init__(self, index: _Optional[int] = ..., plan_name: _Optional[str] = ..., engine_id: _Optional[int] = ..., median_ms: _Optional[float] = ..., error: _Optional[str] = ..., timing: _Optional[str] = ..., knobs: _Optional[_Iterable[_Union[Knob, _Mapping]]] = ..., behavior_notes: _Optional[_Iterable[str]] = ..., workspace_size: _Optional[int] = ...) -> None: ...

class PlanMetadata(_message.Message):
    __slots__ = ("key", "spec_hash", "target", "options", "tensors", "workspace_size", "engine_id", "knobs", "plan_name", "engine_kind", "candidates", "build_seconds", "autotune_seconds", "blob_sha256", "blob_size", "created_at", "built_by", "provisional", "op_family")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    PLAN_NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    BUILD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AUTOTUNE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BLOB_SHA256_FIELD_NUMBER: _ClassVar[int]
    BLOB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BUILT_BY_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    OP_FAMILY_FIELD_NUMBER: _ClassVar[int]
    key: str
    spec_hash: str
    target: Target
    options: CompileOptions
    tensors: _containers.RepeatedCompositeFieldContainer[TensorBinding]
    workspace_size: int
    engine_id: int
    knobs: _containers.RepeatedCompositeFieldContainer[Knob]
    plan_name: str
    engine_kind: EngineKind
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateTiming]
    build_seconds: float
    autotune_seconds: float
    blob_sha256: str
    blob_size: int
    created_at: float
    built_by: str
    provisional: bool
    op_family: str
    def __init__(self, key: _Optional[str] = ..., spec_hash: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., options: _Optional[_Union[CompileOptions, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorBinding, _Mapping]]] = ..., workspace_size: _Optional[int] = ..., engine_id: _Optional[int] = ..., knobs: _Optional[_Iterable[_Union[Knob, _Mapping]]] = ..., plan_name: _Optional[str] = ..., engine_kind: _Optional[_Union[EngineKind, str]] = ..., candidates: _Optional[_Iterable[_Union[CandidateTiming, _Mapping]]] = ..., build_seconds: _Optional[float] = ..., autotune_seconds: _Optional[float] = ..., blob_sha256: _Optional[str] = ..., blob_size: _Optional[int] = ..., created_at: _Optional[float] = ..., built_by: _Optional[str] = ..., provisional: _Optional[bool] = ..., op_family: _Optional[str] = ...) -> None: ...

class PlanSignature(_message.Message):
    __slots__ = ("key_id", "signature", "signed_metadata")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_METADATA_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    signature: bytes
    signed_metadata: bytes
    def __init__(self, key_id: _Optional[str] = ..., signature: _Optional[bytes] = ..., signed_metadata: _Optional[bytes] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("metadata", "blob", "signature")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    metadata: PlanMetadata
    blob: bytes
    signature: PlanSignature
    def __init__(self, metadata: _Optional[_Union[PlanMetadata, _Mapping]] = ..., blob: _Optional[bytes] = ..., signature: _Optional[_Union[PlanSignature, _Mapping]] = ...) -> None: ...

class CompileRequest(_message.Message):
    __slots__ = ("spec", "target", "options", "tuned_only", "answer_miss_at_once", "counted", "claimed_key", "builds_itself")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TUNED_ONLY_FIELD_NUMBER: _ClassVar[int]
    ANSWER_MISS_AT_ONCE_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_KEY_FIELD_NUMBER: _ClassVar[int]
    BUILDS_ITSELF_FIELD_NUMBER: _ClassVar[int]
    spec: GraphSpec
    target: Target
    options: CompileOptions
    tuned_only: bool
    answer_miss_at_once: bool
    counted: bool
    claimed_key: str
    builds_itself: bool
    def __init__(self, spec: _Optional[_Union[GraphSpec, _Mapping]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., options: _Optional[_Union[CompileOptions, _Mapping]] = ..., tuned_only: _Optional[bool] = ..., answer_miss_at_once: _Optional[bool] = ..., counted: _Optional[bool] = ..., claimed_key: _Optional[str] = ..., builds_itself: _Optional[bool] = ...) -> None: ...

class CompileResponse(_message.Message):
    __slots__ = ("plan", "source")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    source: CompileSource
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ..., source: _Optional[_Union[CompileSource, str]] = ...) -> None: ...

class FirstUse(_message.Message):
    __slots__ = ("plan_key", "local")
    PLAN_KEY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    plan_key: str
    local: bool
    def __init__(self, plan_key: _Optional[str] = ..., local: _Optional[bool] = ...) -> None: ...

class OutcomeCount(_message.Message):
    __slots__ = ("target_id", "path", "outcome", "reason", "node_type", "count", "spec_hash")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    path: str
    outcome: GraphOutcome
    reason: str
    node_type: str
    count: int
    spec_hash: str
    def __init__(self, target_id: _Optional[str] = ..., path: _Optional[str] = ..., outcome: _Optional[_Union[GraphOutcome, str]] = ..., reason: _Optional[str] = ..., node_type: _Optional[str] = ..., count: _Optional[int] = ..., spec_hash: _Optional[str] = ...) -> None: ...

class RaceCount(_message.Message):
    __slots__ = ("path", "result", "count")
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    path: str
    result: RaceResult
    count: int
    def __init__(self, path: _Optional[str] = ..., result: _Optional[_Union[RaceResult, str]] = ..., count: _Optional[int] = ...) -> None: ...

class ReportFirstUsesRequest(_message.Message):
    __slots__ = ("uses", "outcomes", "races", "workload")
    USES_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    RACES_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    uses: _containers.RepeatedCompositeFieldContainer[FirstUse]
    outcomes: _containers.RepeatedCompositeFieldContainer[OutcomeCount]
    races: _containers.RepeatedCompositeFieldContainer[RaceCount]
    workload: WorkloadUses
    def __init__(self, uses: _Optional[_Iterable[_Union[FirstUse, _Mapping]]] = ..., outcomes: _Optional[_Iterable[_Union[OutcomeCount, _Mapping]]] = ..., races: _Optional[_Iterable[_Union[RaceCount, _Mapping]]] = ..., workload: _Optional[_Union[WorkloadUses, _Mapping]] = ...) -> None: ...

class WorkloadUses(_message.Message):
    __slots__ = ("name", "target_id", "uses", "prefetched", "used", "wasted", "stopped", "verdict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    PREFETCHED_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    WASTED_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    target_id: str
    uses: _containers.RepeatedCompositeFieldContainer[WorkloadUse]
    prefetched: int
    used: int
    wasted: int
    stopped: int
    verdict: StreamVerdict
    def __init__(self, name: _Optional[str] = ..., target_id: _Optional[str] = ..., uses: _Optional[_Iterable[_Union[WorkloadUse, _Mapping]]] = ..., prefetched: _Optional[int] = ..., used: _Optional[int] = ..., wasted: _Optional[int] = ..., stopped: _Optional[int] = ..., verdict: _Optional[_Union[StreamVerdict, str]] = ...) -> None: ...

class WorkloadUse(_message.Message):
    __slots__ = ("plan_key", "order")
    PLAN_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    plan_key: str
    order: int
    def __init__(self, plan_key: _Optional[str] = ..., order: _Optional[int] = ...) -> None: ...

class ReportFirstUsesResponse(_message.Message):
    __slots__ = ("counted", "outcomes_counted", "workload_recorded")
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_COUNTED_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_RECORDED_FIELD_NUMBER: _ClassVar[int]
    counted: int
    outcomes_counted: int
    workload_recorded: int
    def __init__(self, counted: _Optional[int] = ..., outcomes_counted: _Optional[int] = ..., workload_recorded: _Optional[int] = ...) -> None: ...

class GetWorkloadRequest(_message.Message):
    __slots__ = ("name", "target_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    target_id: str
    def __init__(self, name: _Optional[str] = ..., target_id: _Optional[str] = ...) -> None: ...

class GetWorkloadResponse(_message.Message):
    __slots__ = ("plan_keys", "complete", "settled")
    PLAN_KEYS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    plan_keys: _containers.RepeatedScalarFieldContainer[str]
    complete: bool
    settled: bool
    def __init__(self, plan_keys: _Optional[_Iterable[str]] = ..., complete: _Optional[bool] = ..., settled: _Optional[bool] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: PlanRef
    def __init__(self, ref: _Optional[_Union[PlanRef, _Mapping]] = ...) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("refs", "compile_missing", "tuned_only")
    REFS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MISSING_FIELD_NUMBER: _ClassVar[int]
    TUNED_ONLY_FIELD_NUMBER: _ClassVar[int]
    refs: _containers.RepeatedCompositeFieldContainer[PlanRef]
    compile_missing: bool
    tuned_only: bool
    def __init__(self, refs: _Optional[_Iterable[_Union[PlanRef, _Mapping]]] = ..., compile_missing: _Optional[bool] = ..., tuned_only: _Optional[bool] = ...) -> None: ...

class PrefetchError(_message.Message):
    __slots__ = ("code", "message", "error_class", "retry_delay")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    error_class: str
    retry_delay: _duration_pb2.Duration
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., error_class: _Optional[str] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PrefetchItem(_message.Message):
    __slots__ = ("index", "key", "plan", "error", "source")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    index: int
    key: str
    plan: Plan
    error: PrefetchError
    source: CompileSource
    def __init__(self, index: _Optional[int] = ..., key: _Optional[str] = ..., plan: _Optional[_Union[Plan, _Mapping]] = ..., error: _Optional[_Union[PrefetchError, _Mapping]] = ..., source: _Optional[_Union[CompileSource, str]] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("target_id", "live_workers", "worker_ids")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    live_workers: int
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, target_id: _Optional[str] = ..., live_workers: _Optional[int] = ..., worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListTargetsResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ...) -> None: ...

class InvalidateRequest(_message.Message):
    __slots__ = ("key", "spec_hash", "target_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    spec_hash: str
    target_id: str
    def __init__(self, key: _Optional[str] = ..., spec_hash: _Optional[str] = ..., target_id: _Optional[str] = ...) -> None: ...

class InvalidateResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DrainWorkerResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("target_id",)
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    def __init__(self, target_id: _Optional[str] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class WarmRequest(_message.Message):
    __slots__ = ("target_id", "from_target", "served_days", "manifest", "top", "min_hits", "cancel")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TARGET_FIELD_NUMBER: _ClassVar[int]
    SERVED_DAYS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    MIN_HITS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    from_target: str
    served_days: int
    manifest: WarmManifest
    top: int
    min_hits: float
    cancel: bool
    def __init__(self, target_id: _Optional[str] = ..., from_target: _Optional[str] = ..., served_days: _Optional[int] = ..., manifest: _Optional[_Union[WarmManifest, _Mapping]] = ..., top: _Optional[int] = ..., min_hits: _Optional[float] = ..., cancel: _Optional[bool] = ...) -> None: ...

class WarmManifest(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[PlanQuery]
    def __init__(self, queries: _Optional[_Iterable[_Union[PlanQuery, _Mapping]]] = ...) -> None: ...

class WarmResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: WarmTargetStatus
    def __init__(self, status: _Optional[_Union[WarmTargetStatus, _Mapping]] = ...) -> None: ...

class WarmStatusRequest(_message.Message):
    __slots__ = ("target_id",)
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    def __init__(self, target_id: _Optional[str] = ...) -> None: ...

class WarmStatusResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[WarmTargetStatus]
    def __init__(self, targets: _Optional[_Iterable[_Union[WarmTargetStatus, _Mapping]]] = ...) -> None: ...

class WarmFailure(_message.Message):
    __slots__ = ("plan_key", "reason")
    PLAN_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    plan_key: str
    reason: str
    def __init__(self, plan_key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WarmTargetStatus(_message.Message):
    __slots__ = ("target_id", "source", "state", "total", "built", "skipped", "failed", "in_flight", "remaining", "source_hits_24h", "covered_hits_24h", "coverage", "missing_specs", "created_at", "updated_at", "failures")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUILT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HITS_24H_FIELD_NUMBER: _ClassVar[int]
    COVERED_HITS_24H_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MISSING_SPECS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    source: str
    state: str
    total: int
    built: int
    skipped: int
    failed: int
    in_flight: int
    remaining: int
    source_hits_24h: float
    covered_hits_24h: float
    coverage: float
    missing_specs: int
    created_at: float
    updated_at: float
    failures: _containers.RepeatedCompositeFieldContainer[WarmFailure]
    def __init__(self, target_id: _Optional[str] = ..., source: _Optional[str] = ..., state: _Optional[str] = ..., total: _Optional[int] = ..., built: _Optional[int] = ..., skipped: _Optional[int] = ..., failed: _Optional[int] = ..., in_flight: _Optional[int] = ..., remaining: _Optional[int] = ..., source_hits_24h: _Optional[float] = ..., covered_hits_24h: _Optional[float] = ..., coverage: _Optional[float] = ..., missing_specs: _Optional[int] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., failures: _Optional[_Iterable[_Union[WarmFailure, _Mapping]]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: PlanQuery
    def __init__(self, query: _Optional[_Union[PlanQuery, _Mapping]] = ...) -> None: ...

class StoredVariant(_message.Message):
    __slots__ = ("key", "differences")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCES_FIELD_NUMBER: _ClassVar[int]
    key: str
    differences: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., differences: _Optional[_Iterable[str]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("key", "stored", "spec_hash", "variants", "summary")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    key: str
    stored: bool
    spec_hash: str
    variants: _containers.RepeatedCompositeFieldContainer[StoredVariant]
    summary: str
    def __init__(self, key: _Optional[str] = ..., stored: _Optional[bool] = ..., spec_hash: _Optional[str] = ..., variants: _Optional[_Iterable[_Union[StoredVariant, _Mapping]]] = ..., summary: _Optional[str] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WindowStats(_message.Message):
    __slots__ = ("window", "hits", "misses", "compiles", "failures", "joined", "bytes_served", "build_seconds_saved", "refused", "untrusted_builds")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BUILD_SECONDS_SAVED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_BUILDS_FIELD_NUMBER: _ClassVar[int]
    window: str
    hits: int
    misses: int
    compiles: int
    failures: int
    joined: int
    bytes_served: int
    build_seconds_saved: float
    refused: int
    untrusted_builds: int
    def __init__(self, window: _Optional[str] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., compiles: _Optional[int] = ..., failures: _Optional[int] = ..., joined: _Optional[int] = ..., bytes_served: _Optional[int] = ..., build_seconds_saved: _Optional[float] = ..., refused: _Optional[int] = ..., untrusted_builds: _Optional[int] = ...) -> None: ...

class TargetStats(_message.Message):
    __slots__ = ("target_id", "hits", "misses", "compiles", "failures", "joined", "live_workers", "bytes_served", "build_seconds_saved", "windows", "stored_bytes", "stored_plans", "evicted", "expired", "abandoned")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BUILD_SECONDS_SAVED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_PLANS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    hits: int
    misses: int
    compiles: int
    failures: int
    joined: int
    live_workers: int
    bytes_served: int
    build_seconds_saved: float
    windows: _containers.RepeatedCompositeFieldContainer[WindowStats]
    stored_bytes: int
    stored_plans: int
    evicted: int
    expired: int
    abandoned: int
    def __init__(self, target_id: _Optional[str] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., compiles: _Optional[int] = ..., failures: _Optional[int] = ..., joined: _Optional[int] = ..., live_workers: _Optional[int] = ..., bytes_served: _Optional[int] = ..., build_seconds_saved: _Optional[float] = ..., windows: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ..., stored_bytes: _Optional[int] = ..., stored_plans: _Optional[int] = ..., evicted: _Optional[int] = ..., expired: _Optional[int] = ..., abandoned: _Optional[int] = ...) -> None: ...

class FamilyStats(_message.Message):
    __slots__ = ("family", "windows")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    family: str
    windows: _containers.RepeatedCompositeFieldContainer[WindowStats]
    def __init__(self, family: _Optional[str] = ..., windows: _Optional[_Iterable[_Union[WindowStats, _Mapping]]] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("targets", "op_families")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    OP_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetStats]
    op_families: _containers.RepeatedCompositeFieldContainer[FamilyStats]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetStats, _Mapping]]] = ..., op_families: _Optional[_Iterable[_Union[FamilyStats, _Mapping]]] = ...) -> None: ...

class DimPlace(_message.Message):
    __slots__ = ("uid", "axis")
    UID_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    uid: int
    axis: int
    def __init__(self, uid: _Optional[int] = ..., axis: _Optional[int] = ...) -> None: ...

class VaryingDim(_message.Message):
    __slots__ = ("symbol", "places", "sizes")
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    PLACES_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    symbol: str
    places: _containers.RepeatedCompositeFieldContainer[DimPlace]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, symbol: _Optional[str] = ..., places: _Optional[_Iterable[_Union[DimPlace, _Mapping]]] = ..., sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class GraphFamily(_message.Message):
    __slots__ = ("example", "varying", "fixed_uids")
    EXAMPLE_FIELD_NUMBER: _ClassVar[int]
    VARYING_FIELD_NUMBER: _ClassVar[int]
    FIXED_UIDS_FIELD_NUMBER: _ClassVar[int]
    example: GraphSpec
    varying: _containers.RepeatedCompositeFieldContainer[VaryingDim]
    fixed_uids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, example: _Optional[_Union[GraphSpec, _Mapping]] = ..., varying: _Optional[_Iterable[_Union[VaryingDim, _Mapping]]] = ..., fixed_uids: _Optional[_Iterable[int]] = ...) -> None: ...

class SizesSeen(_message.Message):
    __slots__ = ("symbol", "sizes")
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    symbol: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, symbol: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class BuildFamilyRequest(_message.Message):
    __slots__ = ("family", "target", "options", "seen", "workload")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    family: GraphFamily
    target: Target
    options: CompileOptions
    seen: _containers.RepeatedCompositeFieldContainer[SizesSeen]
    workload: str
    def __init__(self, family: _Optional[_Union[GraphFamily, _Mapping]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., options: _Optional[_Union[CompileOptions, _Mapping]] = ..., seen: _Optional[_Iterable[_Union[SizesSeen, _Mapping]]] = ..., workload: _Optional[str] = ...) -> None: ...

class GetFamilyRequest(_message.Message):
    __slots__ = ("family_key",)
    FAMILY_KEY_FIELD_NUMBER: _ClassVar[int]
    family_key: str
    def __init__(self, family_key: _Optional[str] = ...) -> None: ...

class FamilyStatus(_message.Message):
    __slots__ = ("family_key", "target_id", "total", "stored", "queued", "created_at", "fetched", "bytes", "over_budget", "workload", "cancelled")
    FAMILY_KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    family_key: str
    target_id: str
    total: int
    stored: int
    queued: int
    created_at: float
    fetched: int
    bytes: int
    over_budget: int
    workload: str
    cancelled: bool
    def __init__(self, family_key: _Optional[str] = ..., target_id: _Optional[str] = ..., total: _Optional[int] = ..., stored: _Optional[int] = ..., queued: _Optional[int] = ..., created_at: _Optional[float] = ..., fetched: _Optional[int] = ..., bytes: _Optional[int] = ..., over_budget: _Optional[int] = ..., workload: _Optional[str] = ..., cancelled: _Optional[bool] = ...) -> None: ...

class GetSigningKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SigningKey(_message.Message):
    __slots__ = ("public_key_pem", "key_id", "fingerprint", "state", "created_at", "endorsed_by", "endorsement")
    PUBLIC_KEY_PEM_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDORSED_BY_FIELD_NUMBER: _ClassVar[int]
    ENDORSEMENT_FIELD_NUMBER: _ClassVar[int]
    public_key_pem: str
    key_id: str
    fingerprint: str
    state: SigningKeyState
    created_at: float
    endorsed_by: str
    endorsement: bytes
    def __init__(self, public_key_pem: _Optional[str] = ..., key_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., state: _Optional[_Union[SigningKeyState, str]] = ..., created_at: _Optional[float] = ..., endorsed_by: _Optional[str] = ..., endorsement: _Optional[bytes] = ...) -> None: ...

class GetSigningKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[SigningKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[SigningKey, _Mapping]]] = ...) -> None: ...
