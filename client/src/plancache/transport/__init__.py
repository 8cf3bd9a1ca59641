"""Talking to a server: the Client (client), rich gRPC errors
(rich_status), background prefetch (background), start-up manifests
(manifest).

Owns: the calls and their retries.
May import: plancache.errors, plancache.dtypes, plancache.v1, plancache.spec, plancache.keys, plancache.run, plancache.trust, plancache.transport, plancache.warm.
"""
