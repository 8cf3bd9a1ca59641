"""How a setting is declared: its Option (flag, environment name, help, programs) and the parsers of its text."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancache.addresses import grpc_target
from plancache.errors import InvalidRequest

SERVER, WORKER = "server", "worker"
# How a worker times candidate plans (plancache_server.worker.compiler.timing says how each works).
AUTOTUNE_STRATEGIES = ("screened", "exhaustive")
BOTH = frozenset({SERVER, WORKER})
SERVER_ONLY = frozenset({SERVER})


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "plancache"


@dataclass(frozen=True)
class Option:
    flag: str
    env: str  # PLANCACHE_<env>
    help: str
    parse: Callable[[str], Any]
    programs: frozenset[str]
    # Handed on to the `plancache-worker` processes a server starts.
    to_workers: bool
    is_switch: bool  # a flag without a value (its variable takes plancache.env's words: 1/0, true/false, ...)
    shown_default: str  # in --help and docs/configuration.md ("" for none)


def setting(
    default: Any,
    flag: str,
    help: str,
    parse: Callable[[str], Any] = str,
    *,
    programs: frozenset[str] = BOTH,
    to_workers: bool = False,
    switch: bool = False,
    shown_default: str | None = None,
    factory: Callable[[], Any] | None = None,
    env: str | None = None,
) -> Any:
    """A dataclass field carrying its Option in its metadata, where the parsers and the docs' table find it.

    `env`: the variable's name after PLANCACHE_, when the flag's own would
    mean something else to another plancache program on the same host."""
    env = env or flag.removeprefix("--").replace("-", "_").upper()
    shown = shown_default if shown_default is not None else ("" if default is None else str(default))
    meta = {"option": Option(flag, env, help, parse, programs, to_workers, switch, shown)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_optional_seconds(text: str) -> float | None:
    value = float(text or 0)
    return value if value > 0 else None


def parse_mebibytes(text: str) -> int:
    return int(float(text) * 2**20)


def parse_target_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def parse_autotune_strategy(text: str) -> str:
    if text not in AUTOTUNE_STRATEGIES:
        raise ValueError(f"expected one of {', '.join(AUTOTUNE_STRATEGIES)}")
    return text


def parse_listen(text: str) -> str:
    """A gRPC listen address: host:port (port 0: any free one); a host alone listens on 50051, warned once."""
    try:
        return grpc_target(text, listening=True)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(e.message) from None  # argparse shows its message, as the environment's


def parse_port(text: str) -> int:
    return int(text or 0)


def parse_host_port(text: str) -> str | None:
    """ "0.0.0.0:6379", "[::]:6379", "10.0.0.5:6379"; "" for none."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return text
