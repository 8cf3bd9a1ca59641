"""Issue 33 on a GPU (the lead engineer runs it on the H200; skipped
elsewhere): a real CUDA out-of-memory met by a build is told apart from cuDNN
refusing the graph (plancache_server.worker.compiler.faults), the build
process's answer says so and is not a rejection, and the process's CUDA
context still works afterwards. Safe: it allocates beyond the device's
memory (refused by the driver at once), and fills the device with one
tensor it frees; no Xid is provoked (a lost context cannot be made safely)."""

from __future__ import annotations

import pytest

from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from plancache_server.worker.build_tasks import HEURISTIC, BuildTask, run_task, task_query
from plancache_server.worker.compiler.faults import GpuOutOfMemory, gpu_fault
from tests.support.specs import matmul_spec

pytestmark = pytest.mark.gpu


def test_a_real_cuda_out_of_memory_is_a_gpu_fault_not_a_rejection_and_the_context_survives() -> None:
    import torch

    from plancache_server.worker.compiler.cudnn import CudnnCompiler

    compiler = CudnnCompiler(0)
    free, total = torch.cuda.mem_get_info(0)
    with pytest.raises(torch.OutOfMemoryError) as beyond:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda:0")
    assert isinstance(gpu_fault(beyond.value), GpuOutOfMemory)
    query = PlanQuery.of(matmul_spec(m=1024, n=1024, k=1024), compiler.target, CompileOptions(autotune=False))
    task = BuildTask(1, HEURISTIC, task_query(query))
    filler = torch.empty(free - 64 * 2**20, dtype=torch.uint8, device="cuda:0")  # the device full but for 64 MiB
    try:
        full = run_task(compiler, task)
    finally:
        del filler
        torch.cuda.empty_cache()
    # cuDNN may build this plan in 64 MiB; if it could not, the answer is a GPU fault, never a rejection of the graph.
    assert full.heuristic is not None or (
        full.error.startswith("out of GPU memory") and not full.rejected and not full.gpu_lost
    ), full.error
    after = run_task(compiler, task)
    assert after.heuristic is not None and after.heuristic.chosen.built, after.error  # the context still works
