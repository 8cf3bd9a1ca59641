"""The gRPC gateway: the asyncio server (app), the servicer and the domain
services behind it (servicer; service: Compile and GetPlan, prefetch,
reports, admin, warm_service, signing_keys: GetSigningKeys; resolver and lookups, which they share),
waiting for builds (builds: the registry of flights; flight: one build's;
completions, build_states, refusals), the interceptors and what they check
(guard, auth, wire), the memory cache of verified plans, CPU offload, the
health service.

Owns: answering callers; it queues builds and waits for them, never builds.
May import: plancache, plancache_server.store, plancache_server.telemetry, plancache_server.settings.
"""
