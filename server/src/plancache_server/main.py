"""plancache-server: the gRPC front end, its Redis, and a worker per local GPU."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace

from plancache.signing import generate_keypair
from plancache_server import metrics, web
from plancache_server.app import build_grpc_server
from plancache_server.embedded_redis import EmbeddedRedis
from plancache_server.gpus import select_gpus
from plancache_server.redis_conn import connect
from plancache_server.settings import Settings, server_settings, worker_flags
from plancache_server.status import StatusSource
from plancache_server.supervisor import WorkerProcesses

log = logging.getLogger("plancache_server")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def with_signing_key(settings: Settings) -> Settings:
    """Workers sign plans: with the configured key, or with one this server
    generates once in its data folder (a single-host deployment's default)."""
    if settings.signing_key is not None or settings.unsigned:
        return settings
    private = settings.data_dir / "keys" / "plan-signing.pem"
    public = private.with_name("plan-signing.pub.pem")
    if not private.exists():
        generate_keypair(private.parent)
        log.info("generated a plan-signing key %s", private)
    log.info("workers sign plans with %s; clients must trust %s (trusted_keys= or PLANCACHE_TRUSTED_KEYS)", private, public)
    return replace(settings, signing_key=private)


def main(argv: Sequence[str] | None = None) -> int:
    settings = server_settings(argv)
    configure_logging(settings.log_level)
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if redis_url is None:
        embedded = EmbeddedRedis(settings.data_dir / "redis", binary=settings.redis_server_bin).start()
        redis_url = embedded.url
        log.info("no --redis-url given: using a private redis-server (%s), data in %s", redis_url, embedded.data_dir)
    else:
        log.info("using Redis at %s", redis_url.split("@")[-1])
    client = connect(redis_url)
    server, port, parts = build_grpc_server(client, settings)
    devices = select_gpus(settings.gpus)
    if devices:
        settings = with_signing_key(settings)
    workers = WorkerProcesses(devices, redis_url, settings.compiler, settings.log_level, worker_flags(settings))
    if devices:
        workers.start()
    else:
        log.warning("no GPU on this host: serving stored plans only; Compile of a missing plan needs a worker (plancache-worker) of its target")
    server.start()
    metrics.report_queues(parts.queue)
    http = web.serve(settings.metrics_port, StatusSource(parts.stats, parts.queue, parts.store, parts.builds))
    log.info("plancache-server listening on %s (port %d)", settings.listen, port)

    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    if parts.health is not None:
        parts.health.shutdown()
    # In-flight calls get a grace period to finish (a build under way can
    # land); then waiting callers are released and the workers stop (each
    # finishes its current build; queued jobs stay in the stream for others).
    server.stop(grace=10).wait()
    if http is not None:
        http.stop()
    parts.builds.close()
    parts.stats.close()
    workers.stop()
    if embedded is not None:
        embedded.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
