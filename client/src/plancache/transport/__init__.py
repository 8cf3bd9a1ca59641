"""Talking to a server: the Client (client), rich gRPC errors
(rich_status), background prefetch (background), start-up manifests
(manifest), the hedged miss (hedge), a workload's start-up prefetch
(workload), and what the process tells the service in the background
(reports) of its graphs' outcomes (outcomes).

Owns: the calls and their retries.
May import: plancache.errors, plancache.dtypes, plancache.v1, plancache.graphspec, plancache.keys,
plancache.run, plancache.trust, plancache.transport, plancache.warm, plancache.wire, plancache.gpu,
plancache.addresses, plancache.env, plancache.log_limits.
"""
