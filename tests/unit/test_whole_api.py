"""The spec language past the classic catalog: ops taken from the frontend's
own description (norms' backward, structural ops, ...), uids as the frontend
allows them, the graph's constructor arguments, scalars held in the graph,
slices; every form round-trips through JSON and the proto with its key; bad
input for a new op is refused naming the node. Older specs keep their keys
(tests/unit/test_key_vectors.py holds every example's vector)."""

from __future__ import annotations

import pytest

from plancache import GraphSpec, SpecError
from plancache.graphspec import spec_io
from plancache.graphspec.canonical import canonical_dict
from plancache.graphspec.validation import normalize
from plancache.keys.options import CompileOptions, NoteFilter, PinnedPlan
from plancache.v1 import plancache_pb2 as pb


def layernorm_backward(x_uid: int = 0) -> GraphSpec:
    g = GraphSpec(io_data_type="half")
    dy, x = g.tensor([8, 64, 1, 1], name="dY", uid=1), g.tensor([8, 64, 1, 1], name="X", uid=x_uid)
    scale = g.tensor([1, 64, 1, 1], name="scale", uid=2, data_type="float")
    mean, inv = (
        g.tensor([8, 1, 1, 1], name=n, uid=u, data_type="float") for n, u in (("mean", 3), ("inv_variance", 4))
    )
    dx, d_scale, d_bias = g.node("layernorm_backward", grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv)
    assert dx is not None and d_scale is not None and d_bias is not None
    dx.set_output(True).set_uid(5)
    d_scale.set_output(True).set_uid(6).set_data_type("float")
    d_bias.set_output(True).set_uid(7).set_data_type("float")
    return g


def _roundtrips(spec: GraphSpec) -> None:
    key = spec.spec_hash()
    assert GraphSpec.from_json(spec.to_json()).spec_hash() == key
    assert spec_io.from_proto(pb.GraphSpec.FromString(spec_io.to_proto(spec).SerializeToString())).spec_hash() == key


def test_a_frontend_op_keeps_only_the_result_geometry_the_program_set() -> None:
    spec = layernorm_backward()
    normal = normalize(spec)
    dx = next(t for t in normal.tensors if t.uid == 5)
    assert (
        dx.dim == () and dx.stride == () and dx.inferred_dim == (8, 64, 1, 1)
    )  # cuDNN infers them; later checks see the rule's dims
    tensors = {t["uid"]: t for t in canonical_dict(normal)["tensors"]}
    assert tensors[5]["dim"] == [] and tensors[0]["dim"] == [8, 64, 1, 1]  # uid 0, as the frontend's tests set it
    _roundtrips(spec)
    declared = layernorm_backward()
    next(t for t in declared.tensors if t.uid == 5).set_dim(
        [8, 64, 1, 1]
    )  # a program that set the dims: another graph to cuDNN
    assert declared.spec_hash() != spec.spec_hash()


def test_uids_take_any_integer_the_frontend_takes_within_json_precision() -> None:
    for uid in (0, -5, 2**53):
        assert normalize(layernorm_backward(uid)) is not None
    with pytest.raises(SpecError, match="magnitude at most 2\\*\\*53"):
        normalize(layernorm_backward(2**53 + 1))


def test_graph_arguments_scalars_and_slices_have_forms_and_keys() -> None:
    g = GraphSpec(
        io_data_type="half",
        sm_count=66,
        is_override_shape_enabled=True,
        kernel_cache=True,
        cuda_graph_retention="per_graph",
    )
    x = g.tensor([1, 4, 16, 64], name="x", uid=1)
    sliced = g.node("slice", x, slices=[slice(None), slice(0, 2), slice(0, 16, 2), slice(None)])[0]
    assert sliced is not None
    two = g.tensor_scalar(2, "COMPILE_TIME_CONST", name="two", uid=3)
    g.mul(sliced, two).set_output(True).set_uid(4)
    normal = normalize(g)
    canonical = canonical_dict(normal)
    assert {
        k: canonical[k] for k in ("sm_count", "is_override_shape_enabled", "kernel_cache", "cuda_graph_retention")
    } == {"sm_count": 66, "is_override_shape_enabled": True, "kernel_cache": True, "cuda_graph_retention": "PER_GRAPH"}
    assert next(t for t in canonical["tensors"] if t["uid"] == 3)["constant"] == {
        "value": 2,
        "type": "int",
        "scalar_type": "COMPILE_TIME_CONST",
    }
    assert canonical["nodes"][0]["attributes"]["slices"] == [
        [None, None, None],
        [0, 2, None],
        [0, 16, 2],
        [None, None, None],
    ]
    _roundtrips(g)
    as_float = GraphSpec.from_json(g.to_json())
    next(t for t in as_float.tensors if t.uid == 3).constant = 2.0  # cuDNN lowers an int and a float apart: two keys
    assert as_float.spec_hash() != g.spec_hash()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda n: n.inputs.pop("mean"), r"node 0 \(layernorm_backward_0\): missing required input 'mean'"),
        (
            lambda n: n.inputs.update(nonsense=n.inputs["grad"]),
            r"node 0 \(layernorm_backward_0\): layernorm_backward has no input port 'nonsense'",
        ),
        (
            lambda n: n.attributes.update(has_dbias=True),
            r"node 0 \(layernorm_backward_0\): layernorm_backward has no attribute 'has_dbias'",
        ),
        (lambda n: n.outputs.pop("DBias"), r"node 0 \(layernorm_backward_0\): output 'DBias' is not mapped"),
        (
            lambda n: n.inputs.pop("scale"),
            r"node 0 \(layernorm_backward_0\): layernorm_backward does not produce 'DScale' with these inputs",
        ),
        (
            lambda n: n.inputs["input"].set_dim([8, 0, 1, 1]),
            r"input 'input' of node 0 \(layernorm_backward_0\): dims must be >= 1",
        ),
    ],
    ids=[
        "a missing port",
        "an unknown port",
        "an unknown attribute",
        "an unmapped output",
        "an output the inputs do not make",
        "a zero dim",
    ],
)
def test_bad_input_for_a_new_op_is_refused_naming_the_node(change: object, message: str) -> None:
    spec = layernorm_backward()
    change(spec.nodes[0])  # type: ignore[operator]
    with pytest.raises(SpecError, match=message):
        normalize(spec)


@pytest.mark.parametrize(
    ("op", "attributes", "message"),
    [
        ("transpose", {"permutation": "0,2,1; DROP TABLE plans"}, "attribute 'permutation': expected int list"),
        ("transpose", {"permutation": [0, 2**60, 1]}, "attribute 'permutation': .* has a value outside"),
        ("slice", {"slices": [[0, 4, 0]]}, "attribute 'slices': expected a list of \\[start, stop, step\\]"),
        (
            "reshape",
            {"reshape_mode": "TELEPORT"},
            "attribute 'reshape_mode': 'TELEPORT' is not one of VIEW_ONLY, LOGICAL",
        ),
        ("rope", {"output_scale": float("nan")}, "attribute 'output_scale': expected float"),
        ("rmsnorm_backward", {"has_dbias": 1}, "attribute 'has_dbias': expected bool"),
    ],
)
def test_hostile_parameters_of_new_ops_are_refused_naming_the_node(
    op: str, attributes: dict[str, object], message: str
) -> None:
    g = GraphSpec(io_data_type="half")
    x = g.tensor([2, 4, 8], name="x", uid=1)
    ports = {
        "rope": {"input": x, "freqs": g.tensor([1, 4, 8], name="f", uid=2)},
        "rmsnorm_backward": {"grad": x, "input": x, "inv_variance": x},
    }
    outs = g.node(
        op, **ports.get(op, {"input": x}), **{k: v for k, v in attributes.items() if op != "rmsnorm_backward"}
    )
    g.nodes[0].attributes.update(attributes)
    for t in outs:
        if t is not None:
            t.set_output(True)
    with pytest.raises(SpecError, match=f"node 0 \\({op}_0\\): {message}"):
        normalize(g)


def test_options_carry_a_programs_plan_list_and_keep_older_ids() -> None:
    plain = CompileOptions()
    assert plain.canonical() == {
        "autotune": True,
        "heuristic_modes": ["A", "FALLBACK"],
        "workspace_limit": 0,
        "excluded_behavior_notes": [],
    }
    pinned = CompileOptions(
        autotune=False,
        pinned_plans=(PinnedPlan(7, (("TILE_SIZE", 2), ("SPLIT_K", 1))),),
        pinned_only=True,
        deselected_engines=("eng9", "eng3", "eng9"),
        note_filters=(NoteFilter("numeric", True, ("TENSOR_CORE",)),),
        selected_plan=0,
    )
    assert pinned.pinned_plans[0].knobs == (("SPLIT_K", 1), ("TILE_SIZE", 2)) and pinned.deselected_engines == (
        "eng3",
        "eng9",
    )
    assert (
        pinned.id != plain.id
        and CompileOptions.from_proto(pb.CompileOptions.FromString(pinned.to_proto().SerializeToString())) == pinned
    )
    assert CompileOptions.from_proto(plain.to_proto()).id == plain.id
    with pytest.raises(Exception, match=r"selected_plan .* fixes the plan"):
        CompileOptions(selected_plan=1)
    with pytest.raises(Exception, match="note filter"):
        CompileOptions(note_filters=(NoteFilter("numeric", True, ("NOT_A_NOTE",)),))
