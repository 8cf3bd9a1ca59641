"""plancache: fetch autotuned cuDNN execution plans instead of building them.

    from plancache import Client, GraphSpec
"""

from plancache.client import Client, TargetStats
from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    InvalidRequest,
    NotFound,
    PlanCacheError,
    ServerError,
    SpecError,
    StoreUnavailable,
    TargetUnavailable,
    Unavailable,
)
from plancache.options import CompileOptions
from plancache.plan import Plan
from plancache.spec import GraphSpec, Tensor
from plancache.target import Target

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CompileFailed",
    "CompileOptions",
    "CompileTimeout",
    "GraphSpec",
    "IntegrityError",
    "InvalidRequest",
    "NotFound",
    "Plan",
    "PlanCacheError",
    "ServerError",
    "SpecError",
    "StoreUnavailable",
    "Target",
    "TargetStats",
    "TargetUnavailable",
    "Tensor",
    "Unavailable",
]
