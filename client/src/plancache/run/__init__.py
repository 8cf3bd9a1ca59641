"""Running plans on the local GPU: the plan (plan), its tensors bound by
name or uid (binding, bound), handles, streams and workspaces (execution),
the GPU stack and target detection (gpu), and a node's own build of a
plan (local: the other side of a hedged miss).

Owns: executing plans; it fetches nothing.
May import: plancache.errors, plancache.env, plancache.dtypes, plancache.v1, plancache.graphspec, plancache.keys,
plancache.frontend_graph, plancache.run, plancache.wire, plancache.gpu.
"""
