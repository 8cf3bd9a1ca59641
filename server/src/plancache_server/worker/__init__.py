"""A GPU's compile worker: taking jobs and building them (worker,
worker_queue), its pool of build processes (build_pool, build_process), the
compilers (compiler/), warming's side of a worker (warm_runner), the local
GPUs and the supervisor of worker processes.

Owns: building plans; it never answers callers.
May import: plancache, plancache_server.store, plancache_server.telemetry, plancache_server.settings.
"""
