"""Element types: the names people write, the proto enum, and sizes.

The spelling people write in JSON and Python is the cudnn.data_type member
name in lower case ("half", "bfloat16", "float"), so a spec reads like the
frontend code it replaces.
"""

from __future__ import annotations

from plancache.errors import SpecError
from plancache.v1 import plancache_pb2 as pb

# name -> (proto enum value, bits per element): every cudnn.data_type but NOT_SET.
_TYPES: dict[str, tuple[pb.DataType, int]] = {
    "float": (pb.DATA_TYPE_FLOAT, 32),
    "half": (pb.DATA_TYPE_HALF, 16),
    "bfloat16": (pb.DATA_TYPE_BFLOAT16, 16),
    "double": (pb.DATA_TYPE_DOUBLE, 64),
    "int8": (pb.DATA_TYPE_INT8, 8),
    "int32": (pb.DATA_TYPE_INT32, 32),
    "int64": (pb.DATA_TYPE_INT64, 64),
    "uint8": (pb.DATA_TYPE_UINT8, 8),
    "boolean": (pb.DATA_TYPE_BOOLEAN, 8),
    "fp8_e4m3": (pb.DATA_TYPE_FP8_E4M3, 8),
    "fp8_e5m2": (pb.DATA_TYPE_FP8_E5M2, 8),
    # Vectorized types (cuDNN counts a vector of 4 or 32 as one element).
    "int8x4": (pb.DATA_TYPE_INT8X4, 32),
    "uint8x4": (pb.DATA_TYPE_UINT8X4, 32),
    "int8x32": (pb.DATA_TYPE_INT8X32, 256),
    "fast_float_for_fp8": (pb.DATA_TYPE_FAST_FLOAT_FOR_FP8, 32),
    "fp8_e8m0": (pb.DATA_TYPE_FP8_E8M0, 8),
    "fp8_e5m3": (pb.DATA_TYPE_FP8_E5M3, 8),
    "fp4_e2m1": (pb.DATA_TYPE_FP4_E2M1, 4),
    "int4": (pb.DATA_TYPE_INT4, 4),
}
_ALIASES = {"fp16": "half", "float16": "half", "bf16": "bfloat16", "fp32": "float", "float32": "float"}
_BY_PROTO: dict[int, str] = {value: name for name, (value, _) in _TYPES.items()}

DATA_TYPE_NAMES: tuple[str, ...] = tuple(_TYPES)
INTEGER_TYPES = frozenset({"int8", "int32", "int64", "uint8", "boolean", "int8x4", "uint8x4", "int8x32", "int4"})


def cudnn_name(name: str) -> str:
    """The cudnn.data_type member name of a data type ("half" -> "HALF", "int8x4" -> "INT8x4")."""
    return name.upper().replace("X4", "x4").replace("X32", "x32")


def normalize(name: str, where: str) -> str:
    """The canonical name for a data type, or SpecError naming `where`."""
    if not isinstance(name, str):
        raise SpecError(f"{where}: data type must be a string, got {type(name).__name__}")
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _TYPES:
        raise SpecError(f"{where}: unknown data type {name!r} (expected one of {', '.join(_TYPES)})")
    return key


def to_proto(name: str | None) -> pb.DataType:
    return pb.DATA_TYPE_UNSPECIFIED if name is None else _TYPES[name][0]


def from_proto(value: int, where: str) -> str | None:
    if value == pb.DATA_TYPE_UNSPECIFIED:
        return None
    try:
        return _BY_PROTO[value]
    except KeyError:
        raise SpecError(f"{where}: unknown data type enum value {value}") from None


def bits(name: str) -> int:
    return _TYPES[name][1]


def itemsize(name: str) -> int:
    """Bytes per element, rounded up (a sub-byte type counts a whole byte: an upper bound)."""
    return max(1, _TYPES[name][1] // 8)
