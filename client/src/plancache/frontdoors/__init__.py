"""What the two no-spec front doors share: `plancache.cudnn` (frontend
programs, one line changed) and `plancache.functional` (torch-style
functions). One process talks to one service (service: the client, target
and options both ask with, and `configure`), why a graph was not served and
how that is logged once (reasons), the graph families of shapes that vary
that both count their graphs toward (families), and bucketing (buckets).

Owns: the process's plancache service as the front doors see it, its families and buckets.
May import: plancache.errors, plancache.env, plancache.graphspec, plancache.keys, plancache.run, plancache.transport,
plancache.gpu.
"""
