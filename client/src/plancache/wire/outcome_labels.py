"""The labels of a graph's outcome, as client and server both read them:
the front doors (PATHS), the reason classes a graph built locally may be
counted under (REASONS), and the frontend node types a graph is counted by.
A client reports with them (plancache.transport.outcomes); the server folds
whatever is not among them into OTHER, so a hostile report cannot grow its
label sets (plancache_server.store.fleet).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from plancache.graphspec.frontend_ops import recorded
from plancache.graphspec.ops import CATALOG

OTHER = "other"
# The front doors (race_stats() counts races by the same names).
PATHS = ("compile", "cudnn", "functional")

# Why a graph was built locally (or, in plancache.functional, run by torch):
# the reason classes a client reports and the server accepts. The order is
# the one operators read them in: what they can fix first.
REASONS: dict[str, str] = {
    "no_worker": "no live worker for the target (TargetUnavailable): start one on a GPU of that kind",
    "unavailable": "the server could not be reached, or Redis behind it was down",
    "timeout": "the build took longer than the caller's deadline (CompileTimeout)",
    "refused_for_now": "the server's admission control refused the call (ResourceExhausted)",
    "not_permitted": "the node's token was refused (Unauthenticated, PermissionDenied)",
    "untrusted_plan": "the served plan failed verification (signature, sha256): never deserialized",
    "compile_failed": "cuDNN refused the graph on the worker (CompileFailed)",
    "no_spec_form": "plancache has no spec form for the graph, or the capture differs from it (SpecError)",
    "invalid_request": "the request was malformed (InvalidRequest)",
    "load_failed": "the served plan did not load or run on the node",
    "program_drives": "the program builds or runs candidates itself (build_plan_at_index, execute_plan_at_index)",
    "not_asked": "plancache.functional does not ask cuDNN for this call (dtype, mask, layout, autograd)",
    "hedged": "a hedged miss the node's own build won (the service's plan took over later)",
    "not_stored": "plancache.torch asked for a stored plan only and none was: torch's function ran the call (traced "
    "into a compiled program), the service builds the plan for the next process",
    "no_server": "no server configured in the process (neither configure() nor PLANCACHE_SERVER)",
    OTHER: "anything else",
}


@cache
def node_types() -> frozenset[str]:
    """The frontend's node types, from the catalog recorded with this client (the server bounds labels by it)."""
    return frozenset(recorded().node_types)


def anchor_node_type(types: Iterable[str]) -> str:
    """The node type a graph is counted under: its first non-pointwise node's
    ("POINTWISE:ADD" counts as POINTWISE), else POINTWISE; "" for no node."""
    found = [t.split(":", 1)[0] for t in types]
    return next((t for t in found if t != "POINTWISE"), found[0] if found else "")


def anchor_of_ops(ops: Iterable[str]) -> str:
    """anchor_node_type of a spec's ops (catalog names: "matmul", "sdpa", ...)."""
    return anchor_node_type(CATALOG[op].node_type for op in ops if op in CATALOG)
