"""A GPU's compile worker: taking jobs and building them (worker, its loop
and decisions; worker_queue, job_intake, verified_job, held_builds, lanes,
outcomes, heartbeat), its pool of build processes (build_pool,
build_process, build_tasks, frames), the compilers (compiler/), warming's
side of a worker (warm_runner, warm_intake), the local GPUs and the
supervisor of worker processes.

Owns: building plans; it never answers callers.
May import: plancache, plancache_server.store, plancache_server.telemetry, plancache_server.settings.
"""
