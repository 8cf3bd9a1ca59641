"""The frames a worker and its build processes exchange on a pipe: a
length-prefixed JSON header, then a length-prefixed payload (a PlanQuery
going in, a plan blob coming out)."""

from __future__ import annotations

import json
import struct
from typing import IO, Any

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 2**20


def write_frame(stream: IO[bytes], header: dict[str, Any], payload: bytes = b"") -> None:
    encoded = json.dumps(header).encode()
    stream.write(_LENGTH.pack(len(encoded)) + encoded + _LENGTH.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> tuple[dict[str, Any], bytes] | None:
    """The next frame; None at the end of the stream."""
    parts = []
    for _ in range(2):
        raw = _read_exactly(stream, _LENGTH.size)
        if raw is None:
            return None
        (length,) = _LENGTH.unpack(raw)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
        body = _read_exactly(stream, length)
        if body is None:
            return None
        parts.append(body)
    header = json.loads(parts[0])
    if not isinstance(header, dict):
        raise ValueError("a frame header that is not an object")
    return header, parts[1]


def _read_exactly(stream: IO[bytes], count: int) -> bytes | None:
    chunks, remaining = [], count
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
