"""The settings, grouped by concern: each group a frozen dataclass of declared fields, Settings all of them.

A group is where its settings are read about and changed; every user reads one Settings (the bases hand their
fields on, so `settings.max_waiters` is where it always was).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from plancache.graphspec.validation import Limits
from plancache.trust.signing import key_paths
from plancache_server.settings.declare import (
    SERVER_ONLY,
    default_data_dir,
    parse_autotune_strategy,
    parse_host_port,
    parse_listen,
    parse_mebibytes,
    parse_optional_seconds,
    parse_port,
    parse_target_list,
    setting,
)

# The longest --hedged-hold-max may be: a gateway's mark that a build yields outlives it (gateway.build_states).
HEDGED_HOLD_MAX_LIMIT_S = 60.0
# Its default (the worker's YieldGate takes it when nothing is set): longer than a first node's start with an empty
# JIT cache (GPU run 46: 13 graphs in 4.1-6.2 s; a 3 s hold let the service build and tune beside the node once 3 s
# had passed: 1.09-1.31x its local start).
HEDGED_HOLD_MAX_DEFAULT_S = 30.0


@dataclass(frozen=True)
class DeploymentSettings:
    """Where a server listens, the Redis it keeps plans in, the GPUs and the compiler its workers build with."""

    listen: str = setting("127.0.0.1:50051", "--listen", "gRPC address, host:port", parse_listen, programs=SERVER_ONLY)
    redis_url: str | None = setting(
        None,
        "--redis-url",
        "redis:// or rediss:// URL of the deployment's Redis; redis+cluster://host:port for a Redis Cluster",
        shown_default="none: a private redis-server",
    )
    redis_password_file: Path | None = setting(
        None,
        "--redis-password-file",
        "file holding the password of --redis-url's user (any characters: it is put into the URL quoted; "
        "a container's secret, say), instead of a password written in the URL",
        Path,
    )
    data_dir: Path = setting(
        None,
        "--data-dir",
        "where the private redis-server keeps its data (AOF) and the generated signing key",
        Path,
        programs=SERVER_ONLY,
        factory=default_data_dir,
        shown_default="~/.local/share/plancache",
    )
    redis_listen: str | None = setting(
        None,
        "--redis-listen",
        "host:port where the private redis-server also listens, for compile workers on other hosts "
        "(passwords required; their URL is written to --data-dir/redis/worker-redis-url)",
        parse_host_port,
        programs=SERVER_ONLY,
        shown_default="none: a unix socket only",
    )
    redis_server_bin: str = setting(
        "redis-server",
        "--redis-server-bin",
        "redis-server executable for the private instance",
        programs=SERVER_ONLY,
    )
    repair_store: bool = setting(
        False,
        "--repair-store",
        "the private store's files are damaged: copy them to --data-dir/redis-backups, cut the damage "
        "away (redis-check-aof --fix), start, and report the plans lost (listed on the status page until rebuilt)",
        switch=True,
        programs=SERVER_ONLY,
        shown_default="off",
    )
    gpus: str = setting(
        "auto",
        "--gpus",
        "'auto', 'none', or a comma list of device indices: the compile workers this server starts",
        programs=SERVER_ONLY,
    )
    compiler: str = setting(
        "cudnn", "--compiler", "'cudnn', or module:factory for a stand-in compiler (tests, benchmarks)", to_workers=True
    )
    autotune_strategy: str = setting(
        "screened",
        "--autotune-strategy",
        "'screened' (one CUDA-graph replay per candidate as a screen, precise timing of the close ones) "
        "or 'exhaustive' (every candidate timed precisely)",
        parse_autotune_strategy,
        to_workers=True,
    )
    compile_timeout_s: float = setting(
        900.0,
        "--compile-timeout",
        "seconds a Compile waits for a build when the caller sets no deadline",
        float,
        programs=SERVER_ONLY,
    )


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's bounds (past one, RESOURCE_EXHAUSTED with a retry delay), its event loop and threads, and
    its memory cache of verified plans."""

    max_waiters: int = setting(
        50_000,
        "--max-waiters",
        "callers (call x plan) one gateway lets wait for builds at once",
        int,
        programs=SERVER_ONLY,
    )
    max_waiters_per_key: int = setting(
        5_000,
        "--max-waiters-per-key",
        "callers one gateway lets wait for the same plan's build",
        int,
        programs=SERVER_ONLY,
    )
    caller_streams: int = setting(
        64,
        "--caller-streams",
        "Prefetch streams one caller (its token and host; on an open service its connection) may hold open; also "
        "how many of its large requests may wait for the CPU threads (each caller's are taken one at a time)",
        int,
        programs=SERVER_ONLY,
    )
    caller_refs: int = setting(
        50_000,
        "--caller-refs",
        "plan refs one caller's Prefetch streams may hold unanswered at once",
        int,
        programs=SERVER_ONLY,
    )
    caller_waiters: int = setting(
        1_000,
        "--caller-waiters",
        "waits for builds one caller may hold at once (a Compile that waits; a Prefetch ref with compile_missing)",
        int,
        programs=SERVER_ONLY,
    )
    caller_builds: int = setting(
        64,
        "--caller-builds",
        "builds one caller may have queued on a gateway that have not ended",
        int,
        programs=SERVER_ONLY,
    )
    caller_queued: int = setting(
        8,
        "--caller-queued",
        "builds waiting in a target's build queue at once (not yet taken by a worker), divided among the callers "
        "with builds there now or within the last 10 s (a caller alone: all of them; at least one each); a "
        "caller's next ones wait on the gateway, in order, for one of its own to be taken and for the queue to hold "
        "no other caller's build (the queue is first in first out: the bound on how many go before another "
        "caller's)",
        int,
        programs=SERVER_ONLY,
    )
    work_slots: int = setting(
        1,
        "--work-slots",
        "CPU-heavy steps of calls (a spec checked and hashed, a miss and its build queued, a Prefetch ref) run "
        "at once, granted to callers in turn; a stored plan served from memory takes none",
        int,
        programs=SERVER_ONLY,
    )
    busy_loop_share: float = setting(
        0.5,
        "--busy-loop-share",
        "the share of the time the event loop's thread is runnable (on a CPU or waiting for one; smoothed over "
        "~100 ms) past which it counts as busy: then each caller's turns are paced to its share of the loop among "
        "the callers of the last second (hits count), so that no caller's work takes the others' hits' time (0: "
        "never paced)",
        float,
        programs=SERVER_ONLY,
    )
    max_prefetch_refs: int = setting(
        10_000,
        "--max-prefetch-refs",
        "plan refs in one Prefetch call (more: RESOURCE_EXHAUSTED, split the manifest)",
        int,
        programs=SERVER_ONLY,
    )
    max_prefetch_bytes: int = setting(
        16 * 2**20,
        "--max-prefetch-mb",
        "bytes one Prefetch request may have, MiB (other requests: 4 MiB with a spec, 64 KiB without)",
        parse_mebibytes,
        programs=SERVER_ONLY,
        shown_default="16",
    )
    max_queued_jobs: int = setting(
        10_000,
        "--max-queued-jobs",
        "unfinished builds one target's queue takes; a new job past it is refused at once",
        int,
        programs=SERVER_ONLY,
    )
    retry_delay_s: float = setting(
        1.0,
        "--retry-delay",
        "seconds a refused caller is told to wait before calling again (clients add jitter)",
        float,
        programs=SERVER_ONLY,
    )
    max_pending_calls: int = setting(
        20_000,
        "--max-pending-calls",
        "calls gRPC accepts before the event loop takes them up; past it gRPC refuses new calls (CANCELLED)",
        int,
        programs=SERVER_ONLY,
    )
    max_streams_per_connection: int = setting(
        100,
        "--max-streams-per-connection",
        "calls one client connection may have under way at once (HTTP/2's concurrent streams; more wait in the "
        "client): a burst on one connection cannot fill the queue of calls the event loop takes up in order",
        int,
        programs=SERVER_ONLY,
    )
    workload_plans: int = setting(
        1024,
        "--workload-plans",
        "plans a workload's start-up record keeps per target (least recently used out; 0: no records)",
        int,
        programs=SERVER_ONLY,
    )
    family_budget: int = setting(
        2048,
        "--family-budget",
        "graph family members one workload may have queued per target and day (speculative builds; "
        "BuildFamily queues the nearest the sizes seen first, and says how many it left out)",
        int,
        programs=SERVER_ONLY,
    )
    cpu_threads: int = setting(
        2,
        "--cpu-threads",
        "threads that walk, parse, hash and encode large messages off the event loop (a caller holds one at a time)",
        int,
        programs=SERVER_ONLY,
    )
    event_loop: str = setting(
        "auto", "--event-loop", "'auto' (uvloop when installed), 'uvloop' or 'asyncio'", programs=SERVER_ONLY
    )
    listed_targets: tuple[str, ...] = setting(
        (),
        "--targets",
        "comma list of target ids counted in statistics even while no worker serves them",
        parse_target_list,
        programs=SERVER_ONLY,
        shown_default="none",
    )
    # ---- the gateway's memory cache of verified plans
    memory_cache_bytes: int = setting(
        256 * 2**20,
        "--memory-cache-mb",
        "the gateway's cache of verified plans, MiB (0: every hit reads Redis)",
        parse_mebibytes,
        programs=SERVER_ONLY,
        shown_default="256",
    )
    memory_cache_ttl_s: float = setting(
        30.0,
        "--memory-cache-ttl",
        "seconds a plan deleted from Redis may still be served from that cache",
        float,
        programs=SERVER_ONLY,
    )


@dataclass(frozen=True)
class BuildSettings:
    """Builds and workers: leases, retries, retention and the store's bound, warming, build processes."""

    build_lease_s: float = setting(
        120.0,
        "--build-lease",
        "seconds a build lease (renewed while building) outlives a dead worker",
        float,
        to_workers=True,
    )
    claim_idle_s: float = setting(
        60.0, "--claim-idle", "seconds before a silent worker's job is taken by another", float, to_workers=True
    )
    max_attempts: int = setting(
        3, "--max-attempts", "hand-outs of one job before it fails with the reason", int, to_workers=True
    )
    negative_ttl_s: float = setting(
        3600.0, "--negative-ttl", "seconds a cuDNN rejection is answered from memory", float, to_workers=True
    )
    retention_days: float = setting(
        30.0,
        "--retention-days",
        "plans neither written nor served for this long are deleted (0: kept forever)",
        float,
        programs=SERVER_ONLY,
    )
    store_max_mb: int = setting(
        0,
        "--store-max-mb",
        "bound on the plans' bytes in Redis, MiB; past it the least recently used plans go first "
        "(only plans: never leases, jobs or statistics; 0: no bound)",
        int,
        to_workers=True,
    )
    store_replicas: int = setting(
        0,
        "--store-replicas",
        "replicas that must hold a plan before a worker announces its build (Redis WAIT after the plan's write, "
        "on the plan's master): a failover that promotes one of them loses no plan a caller was given; "
        "0: announced once the master has it (a failover may lose what its master took in its last instant)",
        int,
        to_workers=True,
    )
    store_replicas_wait_ms: int = setting(
        1000,
        "--store-replicas-wait-ms",
        "how long a worker waits for --store-replicas to hold a plan; past it the build is announced anyway, "
        "logged and counted (plancache_unreplicated_plans_total), and the plans it stores in the next 10 s "
        "are not waited for (it stores them one at a time: replicas that are down must not delay every build)",
        int,
        to_workers=True,
    )
    retire_after_days: float = setting(
        90.0,
        "--retire-after-days",
        "a target no worker advertised for this long is listed as retired-eligible on the status page",
        float,
        programs=SERVER_ONLY,
    )
    retire_unserved: bool = setting(
        False,
        "--retire-unserved",
        "also delete the plans of retired-eligible targets (a sweep does)",
        switch=True,
        programs=SERVER_ONLY,
        shown_default="off",
    )
    sweep_interval_s: float = setting(
        60.0,
        "--sweep-interval",
        "seconds between a gateway's sweeps for retention and the bound",
        float,
        programs=SERVER_ONLY,
    )
    build_budget_s: float | None = setting(
        None,
        "--build-budget",
        "seconds one piece of a build (a heuristic plan, a candidate) may take in a build "
        "process; past it the process is ended and the piece fails (a heuristic plan: the job, remembered)",
        parse_optional_seconds,
        to_workers=True,
        shown_default="none",
    )
    no_warm: bool = setting(
        False,
        "--no-warm",
        "a worker does not warm a new target from a sibling's history on its own (operators' "
        "`plancache warm` plans still run)",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    warm_after_idle_s: float = setting(
        10.0,
        "--warm-after-idle",
        "seconds without a caller's heuristic plan to build before a worker warms a target of "
        "its own with fewer plans than a sibling target",
        float,
        to_workers=True,
    )
    tune_after_quiet_s: float = setting(
        0.0,
        "--tune-after-quiet",
        "seconds after a caller's heuristic plan started before a worker starts autotuning candidates (at most "
        "10 s held back), for a worker sharing its host's CPUs with nodes that build their own graphs (0: no wait)",
        float,
        to_workers=True,
    )
    # Longer than a first node's slowest own build (GPU run 41: 0.3-0.65 s for its first graph), so that its
    # next ask comes before the wait ends (plancache_server.worker.lanes.YieldGate).
    hedged_quiet_s: float = setting(
        1.0,
        "--hedged-quiet",
        "seconds without a new hedged miss (a caller building the plan itself meanwhile) before a worker starts "
        "building for such callers, or autotuning (at most --hedged-hold-max held back; plans callers wait for and "
        "warming's first plans go on): built beside nodes building their own graphs, on their host, it slowed those "
        "builds (0: no wait)",
        float,
        to_workers=True,
    )
    hedged_hold_max_s: float = setting(
        HEDGED_HOLD_MAX_DEFAULT_S,
        "--hedged-hold-max",
        "the longest a worker holds back a build for callers that build it themselves while such callers keep "
        "asking (--hedged-quiet), from when it took the build (at most 60 s): a fleet whose nodes never stop "
        "missing has its plans built this soon after; a caller that waits for the plan hurries it at once",
        float,
        to_workers=True,
    )
    build_processes: int = setting(
        0,
        "--build-processes",
        "processes per GPU worker that build plans side by side (each holds a CUDA context); "
        "0: from the host's cores, min(8, cores per GPU - 1)",
        int,
        to_workers=True,
        shown_default="0",
    )
    warm_beside_callers: int = setting(
        -1,
        "--warm-beside-callers",
        "warming's first plans (a graph family's members, a new target's plans) that may build while a caller's "
        "miss builds, on build processes past the first (kept for callers): a program sweeping a family's sizes "
        "misses back to back, and warming that waits for a pause builds its members after it ends (issue 43); "
        "-1: half the processes past the first, 0: warming waits for callers' misses",
        int,
        to_workers=True,
        shown_default="-1",
    )
    heartbeat_interval_s: float = setting(
        2.0, "--heartbeat-interval", "seconds between a worker's heartbeats", float, to_workers=True
    )
    heartbeat_ttl_s: float = setting(
        10.0, "--heartbeat-ttl", "seconds a silent worker still counts as live", float, to_workers=True
    )


@dataclass(frozen=True)
class AccessSettings:
    """Trust and access: the signing key and the keys trusted, the tokens file, TLS."""

    signing_key: Path | None = setting(
        None,
        "--signing-key",
        "Ed25519 private key (PEM) workers sign plans with",
        Path,
        to_workers=True,
        shown_default="generated in --data-dir for the server's own workers",
    )
    trusted_keys: tuple[Path, ...] = setting(
        (),
        "--trusted-keys",
        "Ed25519 public keys (PEM paths separated by ',' or ':') of the workers: plans are checked "
        "before being served; the key of --signing-key (or the generated one) is always added. "
        "Not PLANCACHE_TRUSTED_KEYS: that is the clients' list",
        key_paths,
        programs=SERVER_ONLY,
        env="SERVER_TRUSTED_KEYS",
        shown_default="the key its own workers sign with",
    )
    allow_readable_secrets: bool = setting(
        False,
        "--allow-readable-secrets",
        "start even when the tokens file, signing key or TLS key can be read by "
        "group or others (warned); without it such a file is refused, as ssh does",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    unsigned: bool = setting(
        False,
        "--unsigned",
        "store plans unsigned (clients must allow_unsigned)",
        switch=True,
        to_workers=True,
        shown_default="off",
    )
    tokens_file: Path | None = setting(
        None,
        "--tokens-file",
        "'<read|compile|admin> <token>' lines; without it the service is open",
        Path,
        programs=SERVER_ONLY,
        shown_default="none: open",
    )
    tls_cert: Path | None = setting(
        None,
        "--tls-cert",
        "PEM certificate chain: serve TLS",
        Path,
        programs=SERVER_ONLY,
        shown_default="plaintext",
    )
    tls_key: Path | None = setting(
        None, "--tls-key", "PEM private key of --tls-cert", Path, programs=SERVER_ONLY, shown_default=""
    )
    tls_ca: Path | None = setting(
        None,
        "--tls-ca",
        "PEM CA: require client certificates it signed (mutual TLS)",
        Path,
        programs=SERVER_ONLY,
        shown_default="",
    )


@dataclass(frozen=True)
class OperationsSettings:
    """What operators watch (metrics, logs) and what no flag sets (message size, the spec's limits)."""

    metrics_port: int = setting(
        0,
        "--metrics-port",
        "Prometheus /metrics and the status page (0: off); workers a server starts use the next ports",
        parse_port,
    )
    metrics_host: str = setting(
        "",
        "--metrics-host",
        "interface of --metrics-port (0.0.0.0: every one); no auth there, so by default the --listen host "
        "(a worker: 127.0.0.1)",
        to_workers=True,
        shown_default="the --listen host",
    )
    log_level: str = setting("INFO", "--log-level", "DEBUG, INFO, WARNING or ERROR", str.upper, to_workers=True)
    # ---- not configurable from the command line
    # Largest message sent (a plan with its metadata).
    max_message_bytes: int = 64 * 2**20
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Settings(OperationsSettings, AccessSettings, BuildSettings, GatewaySettings, DeploymentSettings):
    """Every setting of a server or a worker, in one frozen object.

    The bases are listed last group first: a dataclass takes its bases' fields from the last one listed, and that
    order is the flags' in --help, docs/configuration.md's table and the flags a server hands its workers.
    """
