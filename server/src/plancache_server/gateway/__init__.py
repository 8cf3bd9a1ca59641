"""The gRPC gateway: the asyncio server (app), the servicer and the domain
service behind it (servicer, service, warm_service), waiting for builds
(builds), the interceptors and what they check (guard, auth, wire), the
memory cache of verified plans, CPU offload, the health service.

Owns: answering callers; it queues builds and waits for them, never builds.
May import: plancache, plancache_server.store, plancache_server.telemetry, plancache_server.settings.
"""
