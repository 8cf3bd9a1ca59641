"""Configuration: one frozen object; each setting declared once.

A setting is a dataclass field whose metadata names its flag, its
environment variable (PLANCACHE_<NAME>), its help and which programs take it
(`plancache-server`, `plancache-worker`, or both). The argument parsers, the
environment reader, the flags a server hands to the workers it starts and
the README's configuration table all come from these declarations. Flags
win over the environment, the environment over the defaults.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from plancache.graphspec.validation import Limits
from plancache.trust.signing import key_paths

SERVER, WORKER = "server", "worker"
# How a worker times candidate plans (plancache_server.worker.compiler.timing says how each works).
AUTOTUNE_STRATEGIES = ("screened", "exhaustive")
BOTH = frozenset({SERVER, WORKER})


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
    is_switch: bool  # a flag without a value (env "1" turns it on)
    shown_default: str  # in --help and the README ("" for none)


def _option(
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
    """`env`: the variable's name after PLANCACHE_, when the flag's own would
    mean something else to another plancache program on the same host."""
    env = env or flag.removeprefix("--").replace("-", "_").upper()
    shown = shown_default if shown_default is not None else ("" if default is None else str(default))
    meta = {"option": Option(flag, env, help, parse, programs, to_workers, switch, shown)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _optional_seconds(text: str) -> float | None:
    value = float(text or 0)
    return value if value > 0 else None


def _mebibytes(text: str) -> int:
    return int(float(text) * 2**20)


def _target_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _autotune_strategy(text: str) -> str:
    if text not in AUTOTUNE_STRATEGIES:
        raise ValueError(f"expected one of {', '.join(AUTOTUNE_STRATEGIES)}")
    return text


def _port(text: str) -> int:
    return int(text or 0)


@dataclass(frozen=True)
class Settings:
    listen: str = _option("127.0.0.1:50051", "--listen", "gRPC address, host:port", programs=frozenset({SERVER}))
    redis_url: str | None = _option(
        None,
        "--redis-url",
        "redis:// or rediss:// URL of the deployment's Redis; redis+cluster://host:port for a Redis Cluster",
        shown_default="none: a private redis-server",
    )
    data_dir: Path = _option(
        None,
        "--data-dir",
        "where the private redis-server keeps its data (AOF) and the generated signing key",
        Path,
        programs=frozenset({SERVER}),
        factory=default_data_dir,
        shown_default="~/.local/share/plancache",
    )
    redis_server_bin: str = _option(
        "redis-server",
        "--redis-server-bin",
        "redis-server executable for the private instance",
        programs=frozenset({SERVER}),
    )
    repair_store: bool = _option(
        False,
        "--repair-store",
        "the private store's files are damaged: copy them to --data-dir/redis-backups, cut the damage "
        "away (redis-check-aof --fix), start, and report the plans lost (listed on the status page until rebuilt)",
        switch=True,
        programs=frozenset({SERVER}),
        shown_default="off",
    )
    gpus: str = _option(
        "auto",
        "--gpus",
        "'auto', 'none', or a comma list of device indices: the compile workers this server starts",
        programs=frozenset({SERVER}),
    )
    compiler: str = _option(
        "cudnn", "--compiler", "'cudnn', or module:factory for a stand-in compiler (tests, benchmarks)", to_workers=True
    )
    autotune_strategy: str = _option(
        "screened",
        "--autotune-strategy",
        "'screened' (one CUDA-graph replay per candidate as a screen, precise timing of the close ones) or 'exhaustive' (every candidate timed precisely)",
        _autotune_strategy,
        to_workers=True,
    )
    compile_timeout_s: float = _option(
        900.0,
        "--compile-timeout",
        "seconds a Compile waits for a build when the caller sets no deadline",
        float,
        programs=frozenset({SERVER}),
    )
    # ---- admission control (gateway): past a bound, RESOURCE_EXHAUSTED with a retry delay
    max_waiters: int = _option(
        50_000,
        "--max-waiters",
        "callers (call x plan) one gateway lets wait for builds at once",
        int,
        programs=frozenset({SERVER}),
    )
    max_waiters_per_key: int = _option(
        5_000,
        "--max-waiters-per-key",
        "callers one gateway lets wait for the same plan's build",
        int,
        programs=frozenset({SERVER}),
    )
    max_prefetch_refs: int = _option(
        10_000,
        "--max-prefetch-refs",
        "plan refs in one Prefetch call (more: RESOURCE_EXHAUSTED, split the manifest)",
        int,
        programs=frozenset({SERVER}),
    )
    max_prefetch_bytes: int = _option(
        16 * 2**20,
        "--max-prefetch-mb",
        "bytes one Prefetch request may have, MiB (other requests: 4 MiB with a spec, 64 KiB without)",
        _mebibytes,
        programs=frozenset({SERVER}),
        shown_default="16",
    )
    max_queued_jobs: int = _option(
        10_000,
        "--max-queued-jobs",
        "unfinished builds one target's queue takes; a new job past it is refused at once",
        int,
        programs=frozenset({SERVER}),
    )
    retry_delay_s: float = _option(
        1.0,
        "--retry-delay",
        "seconds a refused caller is told to wait before calling again (clients add jitter)",
        float,
        programs=frozenset({SERVER}),
    )
    max_pending_calls: int = _option(
        20_000,
        "--max-pending-calls",
        "calls gRPC accepts before the event loop takes them up; past it gRPC refuses new calls (CANCELLED)",
        int,
        programs=frozenset({SERVER}),
    )
    cpu_threads: int = _option(
        2,
        "--cpu-threads",
        "threads that parse, hash and encode large messages off the event loop",
        int,
        programs=frozenset({SERVER}),
    )
    event_loop: str = _option(
        "auto", "--event-loop", "'auto' (uvloop when installed), 'uvloop' or 'asyncio'", programs=frozenset({SERVER})
    )
    listed_targets: tuple[str, ...] = _option(
        (),
        "--targets",
        "comma list of target ids counted in statistics even while no worker serves them",
        _target_list,
        programs=frozenset({SERVER}),
        shown_default="none",
    )
    # ---- the gateway's memory cache of verified plans
    memory_cache_bytes: int = _option(
        256 * 2**20,
        "--memory-cache-mb",
        "the gateway's cache of verified plans, MiB (0: every hit reads Redis)",
        _mebibytes,
        programs=frozenset({SERVER}),
        shown_default="256",
    )
    memory_cache_ttl_s: float = _option(
        30.0,
        "--memory-cache-ttl",
        "seconds a plan deleted from Redis may still be served from that cache",
        float,
        programs=frozenset({SERVER}),
    )
    # ---- builds and workers
    build_lease_s: float = _option(
        120.0,
        "--build-lease",
        "seconds a build lease (renewed while building) outlives a dead worker",
        float,
        to_workers=True,
    )
    claim_idle_s: float = _option(
        60.0, "--claim-idle", "seconds before a silent worker's job is taken by another", float, to_workers=True
    )
    max_attempts: int = _option(
        3, "--max-attempts", "hand-outs of one job before it fails with the reason", int, to_workers=True
    )
    negative_ttl_s: float = _option(
        3600.0, "--negative-ttl", "seconds a cuDNN rejection is answered from memory", float, to_workers=True
    )
    retention_days: float = _option(
        30.0,
        "--retention-days",
        "plans neither written nor served for this long are deleted (0: kept forever)",
        float,
        programs=frozenset({SERVER}),
    )
    store_max_mb: int = _option(
        0,
        "--store-max-mb",
        "bound on the plans' bytes in Redis, MiB; past it the least recently used plans go first "
        "(only plans: never leases, jobs or statistics; 0: no bound)",
        int,
        to_workers=True,
    )
    retire_after_days: float = _option(
        90.0,
        "--retire-after-days",
        "a target no worker advertised for this long is listed as retired-eligible on the status page",
        float,
        programs=frozenset({SERVER}),
    )
    retire_unserved: bool = _option(
        False,
        "--retire-unserved",
        "also delete the plans of retired-eligible targets (a sweep does)",
        switch=True,
        programs=frozenset({SERVER}),
        shown_default="off",
    )
    sweep_interval_s: float = _option(
        60.0,
        "--sweep-interval",
        "seconds between a gateway's sweeps for retention and the bound",
        float,
        programs=frozenset({SERVER}),
    )
    build_budget_s: float | None = _option(
        None,
        "--build-budget",
        "seconds one piece of a build (a heuristic plan, a candidate) may take in a build "
        "process; past it the process is ended and the piece fails (a heuristic plan: the job, remembered)",
        _optional_seconds,
        to_workers=True,
        shown_default="none",
    )
    no_warm: bool = _option(
        False,
        "--no-warm",
        "a worker does not warm a new target from a sibling's history on its own (operators' "
        "`plancache warm` plans still run)",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    warm_after_idle_s: float = _option(
        10.0,
        "--warm-after-idle",
        "seconds without a caller's heuristic plan to build before a worker warms a target of "
        "its own with fewer plans than a sibling target",
        float,
        to_workers=True,
    )
    build_processes: int = _option(
        0,
        "--build-processes",
        "processes per GPU worker that build plans side by side (each holds a CUDA context); "
        "0: from the host's cores, min(8, cores per GPU - 1)",
        int,
        to_workers=True,
        shown_default="0",
    )
    heartbeat_interval_s: float = _option(
        2.0, "--heartbeat-interval", "seconds between a worker's heartbeats", float, to_workers=True
    )
    heartbeat_ttl_s: float = _option(
        10.0, "--heartbeat-ttl", "seconds a silent worker still counts as live", float, to_workers=True
    )
    # ---- trust and access
    signing_key: Path | None = _option(
        None,
        "--signing-key",
        "Ed25519 private key (PEM) workers sign plans with",
        Path,
        to_workers=True,
        shown_default="generated in --data-dir for the server's own workers",
    )
    trusted_keys: tuple[Path, ...] = _option(
        (),
        "--trusted-keys",
        "Ed25519 public keys (PEM paths separated by ',' or ':') of the workers: plans are checked "
        "before being served; the key of --signing-key (or the generated one) is always added. Not PLANCACHE_TRUSTED_KEYS: "
        "that is the clients' list",
        key_paths,
        programs=frozenset({SERVER}),
        env="SERVER_TRUSTED_KEYS",
        shown_default="the key its own workers sign with",
    )
    allow_readable_secrets: bool = _option(
        False,
        "--allow-readable-secrets",
        "start even when the tokens file, signing key or TLS key can be read by "
        "group or others (warned); without it such a file is refused, as ssh does",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    unsigned: bool = _option(
        False,
        "--unsigned",
        "store plans unsigned (clients must allow_unsigned)",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    tokens_file: Path | None = _option(
        None,
        "--tokens-file",
        "'<read|compile|admin> <token>' lines; without it the service is open",
        Path,
        programs=frozenset({SERVER}),
        shown_default="none: open",
    )
    tls_cert: Path | None = _option(
        None,
        "--tls-cert",
        "PEM certificate chain: serve TLS",
        Path,
        programs=frozenset({SERVER}),
        shown_default="plaintext",
    )
    tls_key: Path | None = _option(
        None, "--tls-key", "PEM private key of --tls-cert", Path, programs=frozenset({SERVER}), shown_default=""
    )
    tls_ca: Path | None = _option(
        None,
        "--tls-ca",
        "PEM CA: require client certificates it signed (mutual TLS)",
        Path,
        programs=frozenset({SERVER}),
        shown_default="",
    )
    # ---- operations
    metrics_port: int = _option(
        0,
        "--metrics-port",
        "Prometheus /metrics and the status page (0: off); workers a server starts use the next ports",
        _port,
    )
    metrics_host: str = _option(
        "",
        "--metrics-host",
        "interface of --metrics-port (0.0.0.0: every one); no auth there, so by default the --listen host "
        "(a worker: 127.0.0.1)",
        to_workers=True,
        shown_default="the --listen host",
    )
    log_level: str = _option("INFO", "--log-level", "DEBUG, INFO, WARNING or ERROR", str.upper, to_workers=True)
    # ---- not configurable from the command line
    # Largest message sent (a plan with its metadata).
    max_message_bytes: int = 64 * 2**20
    limits: Limits = field(default_factory=Limits)


def options(program: str | None = None) -> Iterator[tuple[str, Option]]:
    """(field name, option) of every setting a program takes (None: all)."""
    for f in fields(Settings):
        option = f.metadata.get("option")
        if option is not None and (program is None or program in option.programs):
            yield f.name, option


def parser(program: str) -> argparse.ArgumentParser:
    description = {
        SERVER: "Serve autotuned cuDNN plans over gRPC.",
        WORKER: "Build and autotune plans on local GPUs for a plancache deployment.",
    }
    p = argparse.ArgumentParser(prog=f"plancache-{program}", description=description[program])
    defaults = Settings()
    for name, option in options(program):
        env = os.environ.get(f"PLANCACHE_{option.env}")
        help_text = f"{option.help} (env PLANCACHE_{option.env}" + (
            f"; default {option.shown_default})" if option.shown_default else ")"
        )
        if option.is_switch:
            p.add_argument(
                option.flag,
                dest=name,
                action="store_true",
                default=env == "1" if env is not None else getattr(defaults, name),
                help=help_text,
            )
        else:
            try:
                default = option.parse(env) if env is not None else getattr(defaults, name)
            except ValueError as e:
                p.error(f"PLANCACHE_{option.env}={env!r} (the environment's {option.flag}): {e}")
            p.add_argument(option.flag, dest=name, type=option.parse, default=default, help=help_text)
    if program == WORKER:
        p.add_argument(
            "--device", type=int, action="append", help="GPU index (repeat for several; default: every visible GPU)"
        )
    return p


def settings_from(args: argparse.Namespace, program: str) -> Settings:
    values = {name: getattr(args, name) for name, _ in options(program)}
    settings = Settings(**values)
    if (
        settings.claim_idle_s < 2 * settings.heartbeat_interval_s
        or settings.heartbeat_ttl_s < 2 * settings.heartbeat_interval_s
    ):
        raise SystemExit(
            "--claim-idle and --heartbeat-ttl must be at least twice --heartbeat-interval (a live worker would look dead)"
        )
    if settings.signing_key is not None and settings.unsigned:
        raise SystemExit("--signing-key and --unsigned exclude each other")
    if settings.event_loop not in ("auto", "uvloop", "asyncio"):
        raise SystemExit(f"--event-loop must be auto, uvloop or asyncio, not {settings.event_loop!r}")
    return settings


def server_settings(argv: Sequence[str] | None = None) -> Settings:
    return settings_from(parser(SERVER).parse_args(argv), SERVER)


def worker_flags(settings: Settings) -> list[str]:
    """Flags that hand these settings on to a `plancache-worker` child."""
    flags: list[str] = []
    for name, option in options(WORKER):
        value = getattr(settings, name)
        if not option.to_workers or value is None or value is False:
            continue
        flags += [option.flag] if option.is_switch else [option.flag, str(value)]
    if settings.metrics_port:
        flags += ["--metrics-port", str(settings.metrics_port + 1)]  # a worker adds its device index
    return flags


def markdown_table() -> str:
    """The README's configuration table (kept equal to it by a test)."""
    rows = ["| flag | environment | default | programs | meaning |", "|---|---|---|---|---|"]
    for _, option in options():
        shown = option.shown_default
        default = f"`{shown}`" if shown and " " not in shown else shown or "—"
        meaning = option.help.replace("|", "\\|")
        rows.append(
            f"| `{option.flag}` | `PLANCACHE_{option.env}` | {default} | {', '.join(sorted(option.programs))} | {meaning} |"
        )
    return "\n".join(rows)
