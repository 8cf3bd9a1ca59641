"""The cuDNN frontend's graph (its python IR, `cudnn.pygraph`) made from a
spec (build), its plan list as the program would have made it (plan_list),
and two such graphs compared field by field (compare): the worker builds
every plan from `build`'s graph and list, so does a node's own build of a
hedged miss, and plancache.cudnn checks that the spec it captured from a
program rebuilds into the program's graph before it asks for a plan.
Norm graphs are built with one kernel cache for all their sizes
(kernel_caches).

Needs the frontend (nvidia-cudnn-frontend) at call time, not at import.

Owns: the spec <-> frontend graph correspondence.
May import: plancache.errors, plancache.env, plancache.dtypes, plancache.graphspec, plancache.keys,
plancache.frontend_graph.
"""

from plancache.frontend_graph.build import build_pygraph
from plancache.frontend_graph.compare import differences

__all__ = ["build_pygraph", "differences"]
