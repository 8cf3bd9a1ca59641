"""plancache-worker: compile workers for this host's GPUs, against a shared Redis.

With one --device it is that GPU's worker process; with several (or none
given) it supervises one child process per GPU.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence

from plancache_server.main import configure_logging, redis_is_usable
from plancache_server.settings import WORKER, Settings, parser, settings_from, worker_flags
from plancache_server.worker.compiler.faults import EXIT_GPU_LOST
from plancache_server.worker.gpus import visible_gpus
from plancache_server.worker.supervisor import EXIT_MISCONFIGURED, WorkerProcesses

log = logging.getLogger("plancache_server.worker.worker")


def run_one(device: int, settings: Settings) -> int:
    from plancache.errors import PlanCacheError
    from plancache.trust.signing import Signer
    from plancache_server.secrets import check_secrets
    from plancache_server.store.redis_conn import connect
    from plancache_server.store.warming import Warming
    from plancache_server.web import http as web
    from plancache_server.worker.build_pool import ProcessBuildPool, default_pool_size
    from plancache_server.worker.compiler import load_compiler
    from plancache_server.worker.parts import worker_parts
    from plancache_server.worker.warm_runner import WarmRunner
    from plancache_server.worker.worker import Worker, default_worker_id

    if settings.signing_key is None and not settings.unsigned:
        log.error(
            "plancache-worker needs --signing-key "
            "(Ed25519 PEM; `plancache keygen` makes one) or, explicitly, --unsigned"
        )
        return EXIT_MISCONFIGURED
    try:
        check_secrets(settings)
        signer = Signer.from_file(settings.signing_key) if settings.signing_key else None
    except PlanCacheError as e:
        log.error("%s", e.message)
        return EXIT_MISCONFIGURED
    try:
        compiler = load_compiler(settings.compiler, device, settings.autotune_strategy)
    except ImportError as e:
        log.error(
            "cannot load the %r compiler (%s is missing): install plancache-server[gpu]", settings.compiler, e.name
        )
        return EXIT_MISCONFIGURED
    except Exception as e:  # the GPU does not answer (lost, reset, taken away): the supervisor tries again later
        log.error(
            "GPU %d cannot be used (%s: %s); exiting for the supervisor to start this worker again",
            device,
            type(e).__name__,
            str(e)[:300],
        )
        return EXIT_GPU_LOST
    if settings.compiler != "cudnn":
        log.warning(
            "worker for GPU %d builds with %s, a STAND-IN COMPILER, not cuDNN: "
            "the plans it stores (target %s) are not GPU plans",
            device,
            settings.compiler,
            compiler.target.id,
        )
    assert settings.redis_url is not None
    if not redis_is_usable(settings.redis_url):
        return EXIT_MISCONFIGURED
    parts = worker_parts(connect(settings.redis_url), settings, signer)
    size = settings.build_processes or default_pool_size(max(1, len(visible_gpus())))
    pool = ProcessBuildPool(
        size,
        settings.compiler,
        device,
        settings.autotune_strategy,
        budget_s=settings.build_budget_s,
        log_level=settings.log_level,
    )
    worker_id = default_worker_id(device)
    targets = list(dict.fromkeys([compiler.target, compiler.target.generic()]))
    warm = WarmRunner(
        Warming(parts.store.client),
        parts.store.janitor,
        worker_id,
        targets,
        settings.heartbeat_ttl_s,
        None if settings.no_warm else settings.warm_after_idle_s,
    )
    worker = Worker(
        compiler,
        parts.queue,
        parts.builds,
        parts.store,
        worker_id,
        pool=pool.start(),
        heartbeat_interval_s=settings.heartbeat_interval_s,
        heartbeat_ttl_s=settings.heartbeat_ttl_s,
        claim_idle_s=settings.claim_idle_s,
        max_attempts=settings.max_attempts,
        signer=signer,
        warm=warm,
        tune_after_quiet_s=settings.tune_after_quiet_s,
        hedged_quiet_s=settings.hedged_quiet_s,
        hedged_hold_max_s=settings.hedged_hold_max_s,
        warm_beside_callers=settings.warm_beside_callers,
    )

    metrics_port = settings.metrics_port + device if settings.metrics_port else 0
    try:
        web.serve(metrics_port, host=settings.metrics_host or "127.0.0.1")
    except OSError as e:  # its port taken (another process, an outgoing connection's): it still builds plans
        log.error(
            "worker for GPU %d serves no /metrics: port %d cannot be bound (%s); its builds go on",
            device,
            metrics_port,
            e.strerror or e,
        )

    def on_signal(signum: int, _frame: object) -> None:
        log.info("worker %s: %s, finishing the current job", worker.worker_id, signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.run()
    return EXIT_GPU_LOST if worker.gpu_lost is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser(WORKER).parse_args(argv)
    settings = settings_from(args, WORKER)
    configure_logging(settings.log_level)
    if not settings.redis_url:
        log.error("plancache-worker needs --redis-url (or PLANCACHE_REDIS_URL): the Redis of the deployment it serves")
        return 2
    devices = args.device if args.device is not None else visible_gpus()
    if not devices:
        log.error("no GPU visible: nothing to do")
        return 2
    if len(devices) == 1:
        return run_one(devices[0], settings)
    procs = WorkerProcesses(devices, settings.redis_url, worker_flags(settings))
    procs.start()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    stopping.wait()
    procs.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
