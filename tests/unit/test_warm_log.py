"""What a worker's log says of each warming item it takes: a graph family's member by its size (run 32's
families study needed it to tell which sizes the worker reached when)."""

from __future__ import annotations

from plancache.graphspec import spec_io
from plancache.v1 import plancache_pb2 as pb
from plancache_server.worker.warm_intake import graph_label
from tests.support.layout_specs import conv_bias_relu


def test_a_warming_items_graph_is_named_with_its_first_tensors_dims() -> None:
    spec = spec_io.to_proto(conv_bias_relu(None))
    assert graph_label(spec) == f"graph {spec.name or '(unnamed)'}, first tensor [32, 64, 56, 56]"
    assert graph_label(pb.GraphSpec()) == "graph (unnamed), first tensor []"
