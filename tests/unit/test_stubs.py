"""The committed gRPC stubs are exactly what `make proto` generates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

grpc_tools = pytest.importorskip("grpc_tools.protoc")

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_stubs_gives_no_diff(tmp_path: Path) -> None:
    import importlib.resources

    from grpc_tools import protoc

    proto = "plancache/v1/plancache.proto"
    well_known = (
        importlib.resources.files("grpc_tools") / "_proto"
    )  # google/protobuf/*.proto, as `python -m grpc_tools.protoc` adds
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{well_known}",
        f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(ROOT / "proto" / proto),
    ]
    assert protoc.main(args) == 0, "protoc failed"
    for name in ("plancache_pb2.py", "plancache_pb2_grpc.py", "plancache_pb2.pyi"):
        generated = (tmp_path / "plancache" / "v1" / name).read_text()
        committed = (ROOT / "client" / "src" / "plancache" / "v1" / name).read_text()
        assert generated == committed, f"{name} is stale: run `make proto` and commit"


def test_stubs_import_under_this_runtime() -> None:
    from plancache.v1 import plancache_pb2, plancache_pb2_grpc

    assert plancache_pb2.DESCRIPTOR.package == "plancache.v1"
    assert hasattr(plancache_pb2_grpc, "PlanCacheStub")
    assert "grpc" in sys.modules
