"""plancache: fetch autotuned cuDNN execution plans instead of building them.

    from plancache import Client, GraphSpec
"""

from plancache.client import Client, PrefetchResult, TargetInfo, TargetStats, TLSConfig, WindowCounts
from plancache.disk_cache import DiskCache
from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    PlanCacheError,
    ResourceExhausted,
    ServerError,
    SpecError,
    StoreUnavailable,
    TargetUnavailable,
    Unauthenticated,
    Unavailable,
    UntrustedBuild,
    UntrustedPlan,
)
from plancache.manifest import Manifest, ManifestEntry
from plancache.options import CompileOptions
from plancache.plan import Plan
from plancache.spec import GraphSpec, Tensor
from plancache.target import Target
from plancache.warm import WarmStatus

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CompileFailed",
    "CompileOptions",
    "CompileTimeout",
    "DiskCache",
    "GraphSpec",
    "IntegrityError",
    "InvalidRequest",
    "Manifest",
    "ManifestEntry",
    "NotFound",
    "PermissionDenied",
    "Plan",
    "PlanCacheError",
    "PrefetchResult",
    "ResourceExhausted",
    "ServerError",
    "SpecError",
    "StoreUnavailable",
    "TLSConfig",
    "Target",
    "TargetInfo",
    "TargetStats",
    "TargetUnavailable",
    "Tensor",
    "Unauthenticated",
    "Unavailable",
    "UntrustedBuild",
    "UntrustedPlan",
    "WarmStatus",
    "WindowCounts",
]
