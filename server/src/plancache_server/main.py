"""plancache-server: the gRPC gateway, its Redis, and a worker per local GPU.

The gateway is one asyncio event loop (uvloop when installed): a caller
waiting for a build, or a stream waiting for a slow reader, is a coroutine,
so thousands of them cost memory, not threads, and never hold up a hit.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from plancache.errors import PlanCacheError
from plancache.trust.signing import TRUSTED_KEYS_ENV, generate_keypair
from plancache_server import key_rotation
from plancache_server.gateway.app import Gateway
from plancache_server.gateway.memory_cache import MemoryCachedStore
from plancache_server.key_rotation import signing_key_path
from plancache_server.secrets import check_secrets
from plancache_server.settings import SERVER, Settings, parser, settings_from, worker_flags
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.store.lifecycle import Janitor
from plancache_server.store.redis_checks import check_redis
from plancache_server.store.redis_conn import connect
from plancache_server.store.repair import StoreStartError, repair
from plancache_server.web import http as web
from plancache_server.web import metrics
from plancache_server.web.status import status_of
from plancache_server.worker.gpus import select_gpus
from plancache_server.worker.supervisor import WorkerProcesses

log = logging.getLogger("plancache_server")

SHUTDOWN_GRACE_S = 10.0
# Python's defaults are (700, 10, 10): full collections 100 times rarer (see below).
GC_THRESHOLDS = (700, 10, 1000)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def with_signing_key(settings: Settings) -> Settings:
    """Workers sign plans: with the configured key, or with one this server
    generates once in its data folder (a single-host deployment's default).
    The gateway trusts that key whatever --trusted-keys says (app.gateway_trust)."""
    if settings.signing_key is not None or settings.unsigned:
        return settings
    private = signing_key_path(settings)
    public = private.with_name("plan-signing.pub.pem")
    if not private.exists():
        generate_keypair(private.parent)
        log.info("generated a plan-signing key %s", private)
    log.info(
        "workers sign plans with %s; clients pin its public key with `plancache trust HOST:PORT` "
        "(or trust %s: trusted_keys= or %s)",
        private,
        public,
        TRUSTED_KEYS_ENV,
    )
    return replace(settings, signing_key=private)


def note_client_variables() -> None:
    """A host that runs clients and a server often sets the clients' list of
    keys in a profile the server inherits: say that the server does not read it."""
    if os.environ.get(TRUSTED_KEYS_ENV) and not os.environ.get("PLANCACHE_SERVER_TRUSTED_KEYS"):
        log.info(
            "%s is the clients' list of trusted keys and is not read by the server "
            "(its own: --trusted-keys, PLANCACHE_SERVER_TRUSTED_KEYS)",
            TRUSTED_KEYS_ENV,
        )


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (about 10% less CPU per call) when asked for or available."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def tune_garbage_collector() -> None:
    """A full collection walks every object alive: during a herd (thousands
    of calls and waiters) one took 40-90 ms, a pause every caller feels
    (measured in bench/herd.py: the burst's worst probe, 62-86 ms, was such
    a collection; 12 ms with these settings). What exists after start-up
    (modules, descriptors, settings) lives as long as the process and is
    frozen out of collections; full collections run 100 times more rarely,
    since the cyclic garbage of finished calls is young and is found by the
    first two generations."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(settings: Settings, redis_url: str, devices: Sequence[int] = ()) -> None:
    """`devices`: the GPUs this server started workers for (their metrics ports are listed to Prometheus)."""
    front = await Gateway.start(settings, redis_url)
    tune_garbage_collector()
    loop = asyncio.get_running_loop()
    metrics.report_queues(front.queue, front.directory, loop)
    if front.janitor is not None:
        metrics.report_store(front.janitor.usage)
    if front.loop_load is not None and front.shares is not None:
        load, turns = front.loop_load, front.shares.turns
        metrics.report_loop(lambda: (load.share, turns.paced_s))
    if isinstance(front.store, MemoryCachedStore):
        cache = front.store
        metrics.report_memory_cache(lambda: (cache.bytes_held, cache.plans_held))
    if front.warming is not None:
        metrics.report_warming(front.warming.all_status)
    if front.workloads is not None:
        metrics.report_workloads(front.workloads.summaries, loop)
    # A worker's port: the one worker_flags hands it (metrics port + 1) plus its device index (worker_main).
    scrape = web.ScrapeTargets(settings.metrics_port, {d: settings.metrics_port + 1 + d for d in devices})
    http = web.serve(
        settings.metrics_port,
        status_of(front),
        loop,
        host=settings.metrics_host or web.listen_host(settings.listen),
        scrape=scrape,
    )
    log.info("plancache-server listening on %s (port %d)", settings.listen, front.port)
    stopping = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        log.info("received %s, shutting down", signum.name)
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await stopping.wait()
    await front.stop(grace=SHUTDOWN_GRACE_S)
    if http is not None:
        await asyncio.to_thread(http.stop)


def lock_data_dir(data_dir: Path) -> IO[str]:
    """An exclusive lock on `data_dir` for this process's lifetime: a second
    server on the same folder would start a second private Redis on the same
    files. OSError naming the holder when another process has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / "plancache-server.lock", "a+")  # noqa: SIM115 - held open on purpose
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise OSError(
            f"data folder {data_dir} is in use by {holder}: stop it, or give this server its own --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"plancache-server pid {os.getpid()}\n")
    handle.flush()
    return handle


def redis_is_usable(redis_url: str) -> bool:
    """Logs what plancache_server.store.redis_checks finds, a line each;
    False when one of them must stop the process."""
    client = connect(redis_url)
    try:
        findings = check_redis(client, redis_url.rsplit("@", maxsplit=1)[-1])
    finally:
        client.close()
    for finding in findings:
        if finding.fatal:
            log.error("cannot start: %s", finding.message)
        else:
            log.warning("%s", finding.message)
    return not any(f.fatal for f in findings)


def start_private_store(settings: Settings) -> EmbeddedRedis:
    """The private redis-server on --data-dir/redis. With --repair-store a
    damaged one is repaired first (plancache_server.store.repair) and the
    plans the repair lost are logged and recorded for the status page.
    StoreStartError: one line saying why it cannot start."""
    embedded = EmbeddedRedis(
        settings.data_dir / "redis",
        binary=settings.redis_server_bin,
        unix_socket=True,
        tcp_listen=settings.redis_listen,
    )
    try:
        embedded.start()
    except StoreStartError as e:
        if not (e.damaged and settings.repair_store):
            raise
        log.warning("--repair-store: %s", e)
        done = repair(embedded.data_dir)
        embedded.start()
        client = connect(embedded.url)
        try:
            done = done.with_lost(Janitor(client).record_lost(done.named))
        except PlanCacheError as not_recorded:
            log.warning("the plans the repair lost could not be recorded for the status page: %s", not_recorded.message)
        finally:
            client.close()
        log.warning("%s", done.summary())
        return embedded
    if settings.repair_store:
        log.info("--repair-store: the private store started as it is; nothing to repair")
    return embedded


def main(argv: Sequence[str] | None = None) -> int:
    command_line = parser(SERVER)
    key_rotation.add_flags(command_line)
    args = command_line.parse_args(argv)
    settings = settings_from(args, SERVER)
    if args.signing_key_action:
        return key_rotation.run(settings, args.signing_key_action)
    configure_logging(settings.log_level)
    note_client_variables()
    factory = loop_factory(settings.event_loop)
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    devices = select_gpus(settings.gpus)
    if redis_url is None or devices:  # the data folder is used: one server at a time
        try:
            data_lock = lock_data_dir(settings.data_dir)  # noqa: F841 - held until the process exits
        except OSError as e:
            log.error("%s", e)
            return 1
    if devices:
        settings = with_signing_key(settings)
    try:
        check_secrets(settings)
    except PlanCacheError as e:
        log.error("cannot start: %s", e.message)
        return 1
    if redis_url is None:
        try:
            embedded = start_private_store(settings)
        except (StoreStartError, FileNotFoundError) as e:  # FileNotFoundError: no redis-server
            log.error("cannot start: %s", e)
            return 1
        redis_url = embedded.url
        log.info(
            "no --redis-url given: using a private redis-server (%s), data in %s",
            embedded.shown_url,
            embedded.data_dir,
        )
    elif settings.redis_listen:
        log.error(
            "cannot start: --redis-listen opens the private store to other hosts; "
            "the Redis of --redis-url is opened by its operator (docs/deploying.md)"
        )
        return 1
    elif settings.repair_store:
        log.error(
            "cannot start: --repair-store repairs the private store "
            "(no --redis-url); a shared Redis is repaired by its operator"
        )
        return 1
    else:
        log.info("using Redis at %s", redis_url.split("@")[-1])
    if not redis_is_usable(redis_url):
        if embedded is not None:
            embedded.stop()
        return 1
    workers = WorkerProcesses(devices, redis_url, worker_flags(settings))
    try:
        if devices:
            workers.start()
        else:
            log.warning(
                "no GPU on this host: serving stored plans only; "
                "Compile of a missing plan needs a worker (plancache-worker) of its target: one on a GPU host "
                "joins this server's Redis (docs/deploying.md; `make run REDIS_LISTEN=...` opens make run's "
                "Redis to it), and `make demo` shows the whole path with a CPU stand-in compiler"
            )
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(settings, redis_url, devices))
    except OSError as e:
        log.error("%s", e)
        return 1
    except (
        PlanCacheError
    ) as e:  # a configuration the server cannot start with (a tokens file, a key): said, not a traceback
        log.error("cannot start: %s", e.message)
        return 1
    finally:
        # Each worker finishes its current build; queued jobs stay in the stream for others.
        workers.stop()
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
