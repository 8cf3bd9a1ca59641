"""plancache: fetch autotuned cuDNN execution plans instead of building them.

from plancache import Client, GraphSpec
"""

from plancache.errors import (
    CompileFailed,
    CompileTimeout,
    IntegrityError,
    InvalidRequest,
    NotFound,
    NotStored,
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
from plancache.graphspec.graph import GraphSpec, Tensor
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target
from plancache.run.plan import Plan
from plancache.transport.admin import AdminClient
from plancache.transport.client import Client
from plancache.transport.connection import TLSConfig
from plancache.transport.hedge import RaceCounts, race_stats
from plancache.transport.manifest import Manifest, ManifestEntry
from plancache.transport.results import PrefetchResult, TargetInfo, TargetStats, WindowCounts
from plancache.transport.workload import WorkloadStats, workload_stats
from plancache.trust.disk_cache import DiskCache
from plancache.warm import WarmStatus

__version__ = "0.1.0"

__all__ = [
    "AdminClient",
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
    "NotStored",
    "PermissionDenied",
    "Plan",
    "PlanCacheError",
    "PlanQuery",
    "PrefetchResult",
    "RaceCounts",
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
    "WorkloadStats",
    "race_stats",
    "workload_stats",
]
