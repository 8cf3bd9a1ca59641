"""Configuration: one frozen object built from flags, then PLANCACHE_* env.

Flags win over the environment, the environment over defaults. Both
entry points (`plancache-server`, `plancache-worker`) share the options that
mean the same thing to both.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancache.validation import Limits


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "plancache"


@dataclass(frozen=True)
class Settings:
    listen: str = "127.0.0.1:50051"
    # None: start a private redis-server with data under data_dir.
    redis_url: str | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    redis_server_bin: str = "redis-server"
    # "auto" (every visible GPU), "none", or a comma list of device indices.
    gpus: str = "auto"
    compiler: str = "cudnn"
    grpc_threads: int = 64
    max_message_bytes: int = 64 * 2**20
    # How long a Compile call waits for a build when the caller sets no deadline.
    compile_timeout_s: float = 900.0
    # A build lease (renewed by the building worker) outlives a dead worker
    # by at most this long; longer than claim_idle_s, so a reclaimed job
    # still holds its lease.
    build_lease_s: float = 120.0
    # A job whose worker has been silent this long is taken by another worker.
    claim_idle_s: float = 60.0
    # Hand-outs of one job before it fails (workers dying on it).
    max_attempts: int = 3
    # How long cuDNN's rejection of a graph is remembered.
    negative_ttl_s: float = 3600.0
    # Longest a single build may take (None: no limit).
    build_budget_s: float | None = None
    # Prometheus /metrics (0: off). A server's own workers use the next ports.
    metrics_port: int = 0
    # Ed25519 private key the workers sign plans with; None with unsigned=True.
    signing_key: Path | None = None
    unsigned: bool = False
    # Bearer tokens and roles (see plancache_server.auth); None: open service.
    tokens_file: Path | None = None
    # TLS: certificate chain and key of the server; with tls_ca, clients must
    # present a certificate signed by it (mutual TLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    heartbeat_interval_s: float = 2.0
    heartbeat_ttl_s: float = 10.0
    log_level: str = "INFO"
    limits: Limits = field(default_factory=Limits)
    # The front end's in-process cache of verified plans (0 disables it).
    memory_cache_bytes: int = 256 * 2**20
    # How long a plan deleted from Redis may still be served from that cache.
    memory_cache_ttl_s: float = 30.0


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"PLANCACHE_{name}", default)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=_env("REDIS_URL"), help="redis:// or rediss:// URL (env PLANCACHE_REDIS_URL); default: a private redis-server")
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="env PLANCACHE_LOG_LEVEL")
    parser.add_argument("--compiler", default=_env("COMPILER", "cudnn"), help="'cudnn', or module:factory for a stand-in (env PLANCACHE_COMPILER)")
    parser.add_argument("--heartbeat-ttl", type=float, default=float(_env("HEARTBEAT_TTL", "10") or 10), help="seconds a silent worker counts as live")
    parser.add_argument("--signing-key", type=Path, default=_env("SIGNING_KEY"), help="Ed25519 private key (PEM) workers sign plans with (env PLANCACHE_SIGNING_KEY)")
    parser.add_argument("--unsigned", action="store_true", default=_env("UNSIGNED") == "1", help="store plans unsigned (clients must allow_unsigned)")
    parser.add_argument("--heartbeat-interval", type=float, default=float(_env("HEARTBEAT_INTERVAL", "2") or 2), help="seconds between a worker's heartbeats")
    parser.add_argument("--claim-idle", type=float, default=float(_env("CLAIM_IDLE", "60") or 60), help="seconds before a silent worker's job is reclaimed")
    parser.add_argument("--build-lease", type=float, default=float(_env("BUILD_LEASE", "120") or 120), help="seconds a build lease outlives a dead worker")
    parser.add_argument("--max-attempts", type=int, default=int(_env("MAX_ATTEMPTS", "3") or 3), help="hand-outs of one job before it fails")
    parser.add_argument("--build-budget", type=float, default=float(_env("BUILD_BUDGET", "0") or 0) or None, help="seconds one build may take; past it the job fails and the worker restarts")
    parser.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "0") or 0),
                        help="Prometheus /metrics port (0: off); workers started by a server use port+1+device (env PLANCACHE_METRICS_PORT)")  # fmt: skip
    parser.add_argument("--negative-ttl", type=float, default=float(_env("NEGATIVE_TTL", "3600") or 3600), help="seconds a cuDNN rejection is remembered")


def server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plancache-server", description="Serve autotuned cuDNN plans over gRPC.")
    parser.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:50051"), help="host:port (env PLANCACHE_LISTEN)")
    parser.add_argument("--data-dir", type=Path, default=Path(_env("DATA_DIR") or default_data_dir()), help="where the private redis-server keeps its data (env PLANCACHE_DATA_DIR)")
    parser.add_argument("--redis-server-bin", default=_env("REDIS_SERVER_BIN", "redis-server"), help="redis-server executable for the private instance (env PLANCACHE_REDIS_SERVER_BIN)")
    parser.add_argument("--gpus", default=_env("GPUS", "auto"), help="'auto', 'none' or device indices like 0,1 (env PLANCACHE_GPUS)")
    parser.add_argument("--grpc-threads", type=int, default=int(_env("GRPC_THREADS", "64") or 64))
    parser.add_argument("--compile-timeout", type=float, default=float(_env("COMPILE_TIMEOUT", "900") or 900), help="seconds a Compile waits for a build without a client deadline")
    parser.add_argument("--tokens-file", type=Path, default=_env("TOKENS_FILE"), help="'<read|compile|admin> <token>' lines (env PLANCACHE_TOKENS_FILE); default: no auth")
    parser.add_argument("--tls-cert", type=Path, default=_env("TLS_CERT"), help="PEM certificate chain: serve TLS (env PLANCACHE_TLS_CERT)")
    parser.add_argument("--tls-key", type=Path, default=_env("TLS_KEY"), help="PEM private key of --tls-cert (env PLANCACHE_TLS_KEY)")
    parser.add_argument("--tls-ca", type=Path, default=_env("TLS_CA"), help="PEM CA: require client certificates it signed, mutual TLS (env PLANCACHE_TLS_CA)")
    parser.add_argument("--memory-cache-mb", type=int, default=int(_env("MEMORY_CACHE_MB", "256") or 256), help="in-process cache of verified plans, MiB (0: off)")
    parser.add_argument("--memory-cache-ttl", type=float, default=float(_env("MEMORY_CACHE_TTL", "30") or 30), help="seconds a cached plan is served without re-reading Redis")
    _add_common(parser)
    return parser


def worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plancache-worker", description="Build and autotune plans on local GPUs for a plancache deployment.")
    parser.add_argument("--device", type=int, action="append", help="GPU index (repeat for several; default: every visible GPU)")
    _add_common(parser)
    return parser


def server_settings(argv: Sequence[str] | None = None) -> Settings:
    args = server_parser().parse_args(argv)
    return Settings(
        listen=args.listen,
        redis_url=args.redis_url or None,
        data_dir=args.data_dir,
        redis_server_bin=args.redis_server_bin,
        gpus=args.gpus,
        compiler=args.compiler,
        grpc_threads=args.grpc_threads,
        compile_timeout_s=args.compile_timeout,
        heartbeat_ttl_s=args.heartbeat_ttl,
        log_level=args.log_level.upper(),
        tokens_file=args.tokens_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        memory_cache_bytes=args.memory_cache_mb * 2**20,
        memory_cache_ttl_s=args.memory_cache_ttl,
        **common_settings(args),
    )


def common_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Settings fields both entry points take from their flags."""
    if args.claim_idle < 2 * args.heartbeat_interval or args.heartbeat_ttl < 2 * args.heartbeat_interval:
        raise SystemExit("--claim-idle and --heartbeat-ttl must be at least twice --heartbeat-interval (a live worker would look dead)")
    if args.signing_key and args.unsigned:
        raise SystemExit("--signing-key and --unsigned exclude each other")
    return {
        "signing_key": Path(args.signing_key) if args.signing_key else None,
        "unsigned": args.unsigned,
        "heartbeat_interval_s": args.heartbeat_interval,
        "claim_idle_s": args.claim_idle,
        "build_lease_s": args.build_lease,
        "max_attempts": args.max_attempts,
        "negative_ttl_s": args.negative_ttl,
        "build_budget_s": args.build_budget,
        "metrics_port": args.metrics_port,
    }


def worker_flags(settings: Settings) -> list[str]:
    """Flags that hand these settings on to a `plancache-worker` child."""
    return [
        "--heartbeat-ttl", str(settings.heartbeat_ttl_s), "--heartbeat-interval", str(settings.heartbeat_interval_s),
        "--claim-idle", str(settings.claim_idle_s),
        "--build-lease", str(settings.build_lease_s), "--max-attempts", str(settings.max_attempts),
        "--negative-ttl", str(settings.negative_ttl_s),
        *(["--unsigned"] if settings.unsigned else ["--signing-key", str(settings.signing_key)] if settings.signing_key else []),
        *(["--build-budget", str(settings.build_budget_s)] if settings.build_budget_s else []),
        *(["--metrics-port", str(settings.metrics_port + 1)] if settings.metrics_port else []),
    ]  # fmt: skip
