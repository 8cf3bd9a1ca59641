"""The words of a fault, read into what it is: GPU faults met by a build
(plancache_server.worker.compiler.faults) and Redis refusing a call
(plancache_server.store.redis_conn.store_fault), each with its way out."""

from __future__ import annotations

import pytest
import redis

from plancache_server.store.redis_conn import describe, store_fault
from plancache_server.worker.compiler.faults import GpuLost, GpuOutOfMemory, gpu_fault


@pytest.mark.parametrize(
    ("said", "kind"),
    [
        ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.81 GiB total capacity)", GpuOutOfMemory),
        ("cudnnGraphNotSupportedError: CUDNN_STATUS_ALLOC_FAILED in build_plan_at_index", GpuOutOfMemory),
        ("CUDA error: an illegal memory access was encountered", GpuLost),
        ("CUDA error: unspecified launch failure", GpuLost),
        ("CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered", GpuLost),
        ("CUDA error: no CUDA-capable device is detected", GpuLost),
        ("cudnnGraphNotSupportedError: No valid engine configs for Matmul_", None),
    ],
)
def test_gpu_faults_are_told_from_a_graph_cudnn_refuses(said: str, kind: type[Exception] | None) -> None:
    fault = gpu_fault(RuntimeError(said))
    assert (type(fault) if fault is not None else None) is kind
    assert fault is None or said in str(fault)


@pytest.mark.parametrize(
    ("error", "kind", "way_out"),
    [
        (
            redis.AuthenticationError("invalid username-password pair or user is disabled."),
            "credentials",
            "ACL SETUSER",
        ),
        (
            redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'info' command"),
            "permissions",
            "ACL rules",
        ),
        (redis.ResponseError("MISCONF Errors writing to the AOF file: No space left on device"), "disk", "free space"),
        (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."), "memory", "--store-max-mb"),
        (redis.ResponseError("READONLY You can't write against a read only replica."), "replica", "primary"),
        (redis.ConnectionError("Connection refused"), "unreachable", "once it does"),
    ],
)
def test_redis_failures_carry_their_kind_and_the_way_out(error: Exception, kind: str, way_out: str) -> None:
    assert store_fault(error)[0] == kind
    assert way_out in describe(error) and str(error) in describe(error)
