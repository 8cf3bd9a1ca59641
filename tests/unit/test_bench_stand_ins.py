"""The benchmarks' in-process client (bench/gpu_exec.py, a STAND-IN for plancache.Client that builds
here) takes what the front doors hand a client. GPU run 30 found it refusing the PlanQuery that
plancache.functional passes: every benchmarked call quietly ran torch's fallback and was timed as
plancache's. Here with the stand-in compiler, on the CPU."""

from __future__ import annotations

from bench.gpu_exec import InProcessClient
from plancache.keys.options import CompileOptions
from plancache.keys.query import PlanQuery
from tests.support.specs import matmul_spec
from tests.support.standin import StandInCompiler


def test_the_in_process_client_builds_a_query_and_a_spec_alike() -> None:
    compiler = StandInCompiler(build_seconds=0.0)
    client = InProcessClient(compiler)
    spec = matmul_spec(64, 64, 128, batch=2)
    query = PlanQuery.of(spec, compiler.target, CompileOptions(autotune=False))

    from_query = client.compile(query, timeout=5.0, hedge_path="functional")
    from_spec = client.compile(spec)

    assert from_query.blob == from_spec.blob
    assert from_query.metadata.key == query.key
    assert client.compiled == [query.key, query.key]
