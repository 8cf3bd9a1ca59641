"""Element types: the names people write, the proto enum, and sizes.

The spelling people write in JSON and Python is the cudnn.data_type member
name in lower case ("half", "bfloat16", "float"), so a spec reads like the
frontend code it replaces.
"""

from __future__ import annotations

from plancache.errors import SpecError
from plancache.v1 import plancache_pb2 as pb

# name -> (proto enum value, bytes per element)
_TYPES: dict[str, tuple[pb.DataType, int]] = {
    "float": (pb.DATA_TYPE_FLOAT, 4),
    "half": (pb.DATA_TYPE_HALF, 2),
    "bfloat16": (pb.DATA_TYPE_BFLOAT16, 2),
    "double": (pb.DATA_TYPE_DOUBLE, 8),
    "int8": (pb.DATA_TYPE_INT8, 1),
    "int32": (pb.DATA_TYPE_INT32, 4),
    "int64": (pb.DATA_TYPE_INT64, 8),
    "uint8": (pb.DATA_TYPE_UINT8, 1),
    "boolean": (pb.DATA_TYPE_BOOLEAN, 1),
    "fp8_e4m3": (pb.DATA_TYPE_FP8_E4M3, 1),
    "fp8_e5m2": (pb.DATA_TYPE_FP8_E5M2, 1),
}
_ALIASES = {"fp16": "half", "float16": "half", "bf16": "bfloat16", "fp32": "float", "float32": "float"}
_BY_PROTO: dict[int, str] = {value: name for name, (value, _) in _TYPES.items()}

DATA_TYPE_NAMES: tuple[str, ...] = tuple(_TYPES)
INTEGER_TYPES = frozenset({"int8", "int32", "int64", "uint8", "boolean"})


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


def itemsize(name: str) -> int:
    return _TYPES[name][1]
