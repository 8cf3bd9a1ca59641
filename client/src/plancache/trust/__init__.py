"""What a client accepts: signatures (signing), the keys they are checked
with (public_keys), the keys a user pinned (pins: `plancache trust`), a
signing key's rotation files as the server programs keep them (key_ring),
answers checked against the question (answers), bundles of plans (bundle),
the verified disk cache (disk_cache).

Owns: deciding whether bytes from elsewhere may be deserialized.
May import: plancache.errors, plancache.log_limits, plancache.dtypes, plancache.v1, plancache.graphspec,
plancache.keys, plancache.run, plancache.trust, plancache.env.
"""
