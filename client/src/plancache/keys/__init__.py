"""What makes two plans interchangeable: the GPU target (target), the
compile options (options), and the plan key built from a spec hash, a target
and options (plankey).

Owns: plan keys.
May import: plancache.errors, plancache.v1, plancache.graphspec, plancache.keys.
"""
