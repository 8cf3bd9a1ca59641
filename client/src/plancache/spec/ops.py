"""The op catalog: every cuDNN frontend graph method a spec may use.

One entry per frontend method. Port names are the method's keyword names
(`g.matmul(A=..., B=...)`, `g.sdpa(q=..., k=..., v=...)`) and output ports are
the names the frontend gives the returned tensors, so a spec reads like the
frontend code it replaces and the compiler can call the method by name.

Each entry also knows its shape rule, so a spec with a rank or shape mismatch
is refused before anything is allocated on a GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Dims = tuple[int, ...]
AttrValue = int | float | bool | str | tuple[int, ...]


class ShapeError(ValueError):
    """A shape rule failed; the validator prefixes the node's name."""


class AttrKind(enum.Enum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    INT_LIST = "int list"
    ENUM = "enum"


@dataclass(frozen=True)
class AttrSchema:
    kind: AttrKind
    choices: tuple[str, ...] = ()
    required: bool = False
    default: AttrValue | None = None


# infer(input dims by port, declared output dims by port, attributes)
#   -> output dims by port; raises ShapeError.
InferFn = Callable[[Mapping[str, Dims], Mapping[str, Dims | None], Mapping[str, AttrValue]], dict[str, Dims]]
OutputsFn = Callable[[Mapping[str, AttrValue]], tuple[str, ...]]
CompleteFn = Callable[[Mapping[str, Dims], dict[str, AttrValue]], None]


@dataclass(frozen=True)
class OpSchema:
    name: str
    family: str
    inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...]
    outputs_for: OutputsFn
    all_outputs: tuple[str, ...]
    attributes: Mapping[str, AttrSchema]
    infer: InferFn
    # Fills attribute defaults that depend on input ranks (conv padding ...).
    complete: CompleteFn | None = None
    # Whether the frontend method takes compute_data_type.
    takes_compute_type: bool = True
    # Ports whose tensor values must be integers in [1, bound] for the graph
    # to be meaningful: port -> (input port, axis) giving the bound.
    integer_bounds: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Ports holding indices into another input: values in [0, bound) (page tables).
    index_bounds: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Other ports that need integer tensors (dropout's seed and offset).
    integer_inputs: tuple[str, ...] = ()
    # Outputs the caller asks for by handing the op a tensor (sdpa_backward's
    # dBias=, as in the frontend); never produced otherwise.
    optional_outputs: tuple[str, ...] = ()
    # Ports whose tensors may be ragged (packed variable-length sequences).
    ragged_ports: tuple[str, ...] = ()


def _fixed(*ports: str) -> OutputsFn:
    return lambda _attrs: ports


def _need_rank(port: str, dims: Dims, rank: int | None = None, at_least: int | None = None) -> None:
    if rank is not None and len(dims) != rank:
        raise ShapeError(f"input {port!r} must have rank {rank}, got dims {list(dims)}")
    if at_least is not None and len(dims) < at_least:
        raise ShapeError(f"input {port!r} must have rank >= {at_least}, got dims {list(dims)}")


def _declared_or(declared: Dims | None, inferred: Dims, port: str) -> Dims:
    if declared is not None and tuple(declared) != tuple(inferred):
        raise ShapeError(f"output {port!r} declared with dims {list(declared)} but the op produces {list(inferred)}")
    return inferred


def broadcast(shapes: Sequence[tuple[str, Dims]]) -> Dims:
    """cuDNN pointwise broadcasting: equal ranks, each dim equal or 1."""
    (first_port, first), *rest = shapes
    out = list(first)
    for port, dims in rest:
        if len(dims) != len(out):
            raise ShapeError(
                f"inputs {first_port!r} {list(first)} and {port!r} {list(dims)} have different ranks"
                " (pointwise inputs broadcast over dims of size 1 but must share a rank)"
            )
        for i, (a, b) in enumerate(zip(out, dims, strict=True)):
            if a != b and 1 not in (a, b):
                raise ShapeError(f"inputs {first_port!r} {list(first)} and {port!r} {list(dims)} do not broadcast at axis {i}")
            out[i] = max(a, b)
    return tuple(out)


# ---------------------------------------------------------------------------
# pointwise
# ---------------------------------------------------------------------------


def _pointwise_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]) -> dict[str, Dims]:
    return {"OUT_0": _declared_or(outs.get("OUT_0"), broadcast(list(ins.items())), "OUT_0")}


def _pointwise(name: str, ports: tuple[str, ...], attrs: Mapping[str, AttrSchema] | None = None) -> OpSchema:
    return OpSchema(
        name=name,
        family="pointwise",
        inputs=ports,
        optional_inputs=(),
        outputs_for=_fixed("OUT_0"),
        all_outputs=("OUT_0",),
        attributes=attrs or {},
        infer=_pointwise_infer,
    )


_UNARY = (
    "abs", "ceil", "cos", "elu", "erf", "exp", "floor", "gelu", "gelu_approx_tanh", "identity",
    "log", "neg", "reciprocal", "rsqrt", "sigmoid", "sin", "softplus", "sqrt", "tan", "tanh",
)  # fmt: skip
_BINARY_AB = ("add", "sub", "mul", "div")
_BINARY_IN01 = ("max", "min", "pow")

_F = AttrSchema(AttrKind.FLOAT)
_B = AttrSchema(AttrKind.BOOL)
_INTS = AttrSchema(AttrKind.INT_LIST)

# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------


def _matmul_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]) -> dict[str, Dims]:
    a, b = ins["A"], ins["B"]
    _need_rank("A", a, at_least=2)
    _need_rank("B", b, at_least=2)
    if len(a) != len(b):
        raise ShapeError(f"A {list(a)} and B {list(b)} must have the same rank (batch dims broadcast over size 1)")
    if a[-1] != b[-2]:
        raise ShapeError(f"A {list(a)} @ B {list(b)}: inner dims differ ({a[-1]} != {b[-2]})")
    batch = broadcast([("A batch", a[:-2]), ("B batch", b[:-2])]) if len(a) > 2 else ()
    return {"C": _declared_or(outs.get("C"), (*batch, a[-2], b[-1]), "C")}


# ---------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------

_CONV_ATTRS = {"padding": _INTS, "pre_padding": _INTS, "post_padding": _INTS, "stride": _INTS, "dilation": _INTS}


def _conv_geometry(spatial: int, attrs: Mapping[str, AttrValue]) -> tuple[list[int], list[int], list[int], list[int]]:
    def ints(name: str, default: int) -> list[int]:
        value = attrs.get(name)
        if value is None:
            return [default] * spatial
        assert isinstance(value, tuple)
        if len(value) != spatial:
            raise ShapeError(f"attribute {name!r} has {len(value)} values but the convolution has {spatial} spatial dims")
        return list(value)

    pad = ints("padding", 0)
    pre = ints("pre_padding", 0) if "pre_padding" in attrs else pad
    post = ints("post_padding", 0) if "post_padding" in attrs else pad
    stride, dilation = ints("stride", 1), ints("dilation", 1)
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation) or any(p < 0 for p in pre + post):
        raise ShapeError("stride and dilation must be >= 1 and padding >= 0")
    return pre, post, stride, dilation


def conv_output_dims(image: Dims, weight: Dims, attrs: Mapping[str, AttrValue]) -> Dims:
    """Forward-convolution output dims, NCHW-style logical order."""
    spatial = len(image) - 2
    pre, post, stride, dilation = _conv_geometry(spatial, attrs)
    out = [image[0], weight[0]]
    for i in range(spatial):
        effective = (weight[i + 2] - 1) * dilation[i] + 1
        size = (image[i + 2] + pre[i] + post[i] - effective) // stride[i] + 1
        if size < 1:
            raise ShapeError(
                f"spatial axis {i}: filter {weight[i + 2]} (dilated {effective}) does not fit input {image[i + 2]} with padding {pre[i]}+{post[i]}"
            )
        out.append(size)
    return tuple(out)


def _check_channels(image: Dims, weight: Dims, image_port: str, weight_port: str) -> None:
    if len(image) < 3 or len(weight) != len(image):
        raise ShapeError(f"{image_port!r} {list(image)} and {weight_port!r} {list(weight)} must share a rank >= 3 (N, C, spatial...)")
    if weight[1] < 1 or image[1] % weight[1] != 0:
        raise ShapeError(f"{image_port!r} has {image[1]} channels, not a multiple of {weight_port!r}'s {weight[1]} input channels")


def _conv_complete(ins: Mapping[str, Dims], attrs: dict[str, AttrValue]) -> None:
    first = next(iter(ins.values()))
    spatial = max(len(first) - 2, 0)
    if "pre_padding" not in attrs and "post_padding" not in attrs:
        attrs.setdefault("padding", (0,) * spatial)
    attrs.setdefault("stride", (1,) * spatial)
    attrs.setdefault("dilation", (1,) * spatial)


def _conv_fprop_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    _check_channels(ins["image"], ins["weight"], "image", "weight")
    return {"Y": _declared_or(outs.get("Y"), conv_output_dims(ins["image"], ins["weight"], attrs), "Y")}


def _conv_dgrad_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    loss, filt = ins["loss"], ins["filter"]
    declared = outs.get("DX")
    if declared is None:
        raise ShapeError("output 'DX' needs explicit dims: a strided convolution's input size is ambiguous")
    _check_channels(declared, filt, "DX", "filter")
    if conv_output_dims(declared, filt, attrs) != tuple(loss):
        raise ShapeError(
            f"convolving DX {list(declared)} with filter {list(filt)} gives {list(conv_output_dims(declared, filt, attrs))}, not loss {list(loss)}"
        )
    return {"DX": tuple(declared)}


def _conv_wgrad_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    image, loss = ins["image"], ins["loss"]
    declared = outs.get("DW")
    if declared is None:
        raise ShapeError("output 'DW' needs explicit dims (the filter size cannot be inferred)")
    _check_channels(image, declared, "image", "DW")
    if declared[0] != loss[1]:
        raise ShapeError(f"DW {list(declared)} has {declared[0]} output channels but loss {list(loss)} has {loss[1]}")
    if conv_output_dims(image, declared, attrs) != tuple(loss):
        raise ShapeError(
            f"convolving image {list(image)} with DW {list(declared)} gives {list(conv_output_dims(image, declared, attrs))}, not loss {list(loss)}"
        )
    return {"DW": tuple(declared)}


def _conv(name: str, ports: tuple[str, str], out: str, infer: InferFn) -> OpSchema:
    return OpSchema(
        name=name,
        family="conv",
        inputs=ports,
        optional_inputs=(),
        outputs_for=_fixed(out),
        all_outputs=(out,),
        attributes=_CONV_ATTRS,
        infer=infer,
        complete=_conv_complete,
    )


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

_SDPA_ATTRS = {
    "attn_scale": _F,
    "use_causal_mask": AttrSchema(AttrKind.BOOL, default=False),
    "use_causal_mask_bottom_right": AttrSchema(AttrKind.BOOL, default=False),
    "use_padding_mask": AttrSchema(AttrKind.BOOL, default=False),
    "sliding_window_length": AttrSchema(AttrKind.INT),
    "use_alibi_mask": AttrSchema(AttrKind.BOOL, default=False),
}
# Paged KV cache (forward): k and v are page pools [pages, h, page size, d];
# per-sequence page tables [b, 1, pages per sequence, 1] (int32) index them.
_PAGED_PORTS = ("paged_attention_k_table", "paged_attention_v_table")
_PAGED_ATTRS = {"paged_attention_max_seq_len_kv": AttrSchema(AttrKind.INT)}
# Philox dropout: the frontend's dropout=(probability, seed, offset) tuple as an
# attribute and two integer [1, 1, 1, 1] tensors (the backward must get the
# forward's seed and offset to drop the same elements).
_DROPOUT_PORTS = ("dropout_seed", "dropout_offset")
# Packed (ragged) sequences: token totals bounding the packed Q and K/V.
_RAGGED_ATTRS = {"max_total_seq_len_q": AttrSchema(AttrKind.INT), "max_total_seq_len_kv": AttrSchema(AttrKind.INT)}
_TRAINING_ATTRS = {"dropout_probability": _F, **_RAGGED_ATTRS}


def _sdpa_common(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> None:
    q, k, v = ins["q"], ins["k"], ins["v"]
    for port in ("q", "k", "v"):
        _need_rank(port, ins[port], rank=4)
    paged = _sdpa_paged(ins, attrs)
    if not paged and not (q[0] == k[0] == v[0]):
        raise ShapeError(f"q {list(q)}, k {list(k)} and v {list(v)} must share the batch dim (axis 0)")
    if k[1] != v[1] or k[1] < 1 or q[1] % k[1] != 0:
        raise ShapeError(f"heads: k and v must have the same head count dividing q's (q {q[1]}, k {k[1]}, v {v[1]})")
    if k[2] != v[2]:
        raise ShapeError(f"k {list(k)} and v {list(v)} must have the same {'page size' if paged else 'sequence length'} (axis 2)")
    if q[3] != k[3]:
        raise ShapeError(f"q {list(q)} and k {list(k)} must have the same head dim (axis 3)")
    padded = bool(attrs.get("use_padding_mask"))
    for port in ("seq_len_q", "seq_len_kv"):
        if padded and port not in ins:
            raise ShapeError(f"use_padding_mask needs input {port!r} (per-batch lengths, dims [b,1,1,1])")
        if port in ins and tuple(ins[port]) != (q[0], 1, 1, 1):
            raise ShapeError(f"input {port!r} must have dims [{q[0]}, 1, 1, 1], got {list(ins[port])}")


def _sdpa_paged(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> bool:
    """Check a paged KV cache's page tables; whether the graph is paged."""
    q, k = ins["q"], ins["k"]
    given = [p for p in _PAGED_PORTS if p in ins]
    max_kv = attrs.get("paged_attention_max_seq_len_kv")
    if not given:
        if max_kv is not None:
            raise ShapeError("paged_attention_max_seq_len_kv is for a paged KV cache: give paged_attention_k_table and paged_attention_v_table")
        return False
    if len(given) != 2:
        raise ShapeError("a paged KV cache needs both paged_attention_k_table and paged_attention_v_table")
    if not isinstance(max_kv, int) or max_kv < 1:
        raise ShapeError("a paged KV cache needs paged_attention_max_seq_len_kv (the longest sequence, tokens)")
    if not attrs.get("use_padding_mask"):
        raise ShapeError("a paged KV cache needs use_padding_mask with seq_len_q and seq_len_kv (each sequence's length)")
    for port in _PAGED_PORTS:
        table = ins[port]
        if len(table) != 4 or table[0] != q[0] or table[1] != 1 or table[3] != 1:
            raise ShapeError(f"input {port!r} must have dims [{q[0]}, 1, pages per sequence, 1], got {list(table)}")
        if table[2] * k[2] < max_kv:
            raise ShapeError(f"input {port!r}: {table[2]} pages of {k[2]} tokens hold fewer than paged_attention_max_seq_len_kv = {max_kv}")
    return True


def _sdpa_bias(ins: Mapping[str, Dims]) -> None:
    if "bias" not in ins:
        return
    q, k, bias = ins["q"], ins["k"], ins["bias"]
    s_kv = k[2]
    if len(bias) != 4 or bias[0] not in (1, q[0]) or bias[1] not in (1, q[1]) or bias[2] != q[2] or bias[3] != s_kv:
        raise ShapeError(f"input 'bias' must have dims [1 or {q[0]}, 1 or {q[1]}, {q[2]}, {s_kv}], got {list(bias)}")


def _sdpa_dropout(ins: Mapping[str, Dims], attrs: Mapping[str, AttrValue]) -> None:
    given = [p for p in _DROPOUT_PORTS if p in ins]
    probability = attrs.get("dropout_probability")
    if not given and probability is None:
        return
    if len(given) != 2 or probability is None:
        raise ShapeError("dropout needs dropout_probability with both dropout_seed and dropout_offset (the frontend's dropout=(p, seed, offset))")
    assert isinstance(probability, float)
    if not 0.0 < probability < 1.0:
        raise ShapeError(f"dropout_probability must be in (0, 1), got {probability}")
    for port in _DROPOUT_PORTS:
        if tuple(ins[port]) != (1, 1, 1, 1):
            raise ShapeError(f"input {port!r} must have dims [1, 1, 1, 1], got {list(ins[port])}")


def _sdpa_outputs(attrs: Mapping[str, AttrValue]) -> tuple[str, ...]:
    return ("O", "Stats") if attrs.get("generate_stats") else ("O",)


def _sdpa_alibi(attrs: Mapping[str, AttrValue]) -> None:
    if attrs.get("use_alibi_mask") and not (attrs.get("use_causal_mask") or attrs.get("use_causal_mask_bottom_right")):
        raise ShapeError("use_alibi_mask needs use_causal_mask (cuDNN: ALiBi needs a right bound of 0)")


def _sdpa_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    _sdpa_common(ins, attrs)
    if "bias" in ins and _sdpa_paged(ins, attrs):
        raise ShapeError("a bias tensor with a paged KV cache is not supported")
    _sdpa_bias(ins)
    _sdpa_alibi(attrs)
    _sdpa_dropout(ins, attrs)
    q, v = ins["q"], ins["v"]
    result = {"O": _declared_or(outs.get("O"), (*q[:3], v[3]), "O")}
    if attrs.get("generate_stats"):
        result["Stats"] = _declared_or(outs.get("Stats"), (*q[:3], 1), "Stats")
    return result


# FP8 SDPA forward: per-tensor dequantization scales of q, k, v and the
# softmax output S, the quantization scales of S and O (all [1, 1, 1, 1], float).
_FP8_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


def _sdpa_fp8_outputs(attrs: Mapping[str, AttrValue]) -> tuple[str, ...]:
    return ("O", "Stats", "Amax_S", "Amax_O") if attrs.get("generate_stats") else ("O", "Amax_S", "Amax_O")


def _sdpa_fp8_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    for port in _FP8_SCALES:
        if tuple(ins[port]) != (1, 1, 1, 1):
            raise ShapeError(f"input {port!r} must have dims [1, 1, 1, 1] (one scale per tensor), got {list(ins[port])}")
    result = _sdpa_infer({p: d for p, d in ins.items() if p not in _FP8_SCALES}, outs, attrs)
    for amax in ("Amax_S", "Amax_O"):
        result[amax] = _declared_or(outs.get(amax), (1, 1, 1, 1), amax)
    return result


def _sdpa_backward_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
    _sdpa_common(ins, attrs)
    q, v = ins["q"], ins["v"]
    expected = {"o": (*q[:3], v[3]), "dO": (*q[:3], v[3]), "stats": (*q[:3], 1)}
    for port, dims in expected.items():
        if tuple(ins[port]) != dims:
            raise ShapeError(f"input {port!r} must have dims {list(dims)}, got {list(ins[port])}")
    _sdpa_bias(ins)
    _sdpa_alibi(attrs)
    _sdpa_dropout(ins, attrs)
    grads = {grad: _declared_or(outs.get(grad), ins[port], grad) for port, grad in (("q", "dQ"), ("k", "dK"), ("v", "dV"))}
    if "dBias" in outs:
        if "bias" not in ins:
            raise ShapeError("output 'dBias' (the bias gradient) needs input 'bias'")
        grads["dBias"] = _declared_or(outs["dBias"], ins["bias"], "dBias")
    return grads


# ---------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------

_PHASE = AttrSchema(AttrKind.ENUM, choices=("TRAINING", "INFERENCE"), required=True)


def _stat_dims(x: Dims) -> Dims:
    return (x[0], *([1] * (len(x) - 1)))


def _check_param(port: str, dims: Dims, expected: Dims) -> None:
    if tuple(dims) != tuple(expected):
        raise ShapeError(f"input {port!r} must have dims {list(expected)}, got {list(dims)}")


def _check_scalar(ins: Mapping[str, Dims], port: str) -> None:
    if port in ins and any(d != 1 for d in ins[port]):
        raise ShapeError(f"input {port!r} must be a scalar (all dims 1), got {list(ins[port])}")


def _norm_infer(stats: tuple[str, ...]) -> InferFn:
    def infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]) -> dict[str, Dims]:
        x = ins["input"]
        _need_rank("input", x, at_least=2)
        for port in ("scale", "bias"):
            if port in ins:
                _check_param(port, ins[port], (1, *x[1:]))
        _check_scalar(ins, "epsilon")
        result = {"Y": _declared_or(outs.get("Y"), x, "Y")}
        if attrs.get("norm_forward_phase") == "TRAINING":
            for port in stats:
                result[port] = _declared_or(outs.get(port), _stat_dims(x), port)
        return result

    return infer


def _norm_outputs(stats: tuple[str, ...]) -> OutputsFn:
    return lambda attrs: ("Y", *stats) if attrs.get("norm_forward_phase") == "TRAINING" else ("Y",)


def _norm(name: str, stats: tuple[str, ...], optional: tuple[str, ...]) -> OpSchema:
    required = tuple(p for p in ("input", "scale", "bias", "epsilon") if p not in optional)
    return OpSchema(
        name=name,
        family="norm",
        inputs=required,
        optional_inputs=optional,
        outputs_for=_norm_outputs(stats),
        all_outputs=("Y", *stats),
        attributes={"norm_forward_phase": _PHASE},
        infer=_norm_infer(stats),
    )


def _batchnorm_inference_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]) -> dict[str, Dims]:
    x = ins["input"]
    _need_rank("input", x, at_least=2)
    per_channel = (1, x[1], *([1] * (len(x) - 2)))
    for port in ("mean", "inv_variance", "scale", "bias"):
        _check_param(port, ins[port], per_channel)
    return {"Y": _declared_or(outs.get("Y"), x, "Y")}


# ---------------------------------------------------------------------------
# reduction
# ---------------------------------------------------------------------------

_REDUCTION_MODES = ("ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS")


def _reduction_infer(ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]) -> dict[str, Dims]:
    x, declared = ins["input"], outs.get("OUT_0")
    if declared is None:
        raise ShapeError("output 'OUT_0' needs explicit dims (size 1 on every reduced axis)")
    if len(declared) != len(x) or any(o not in (i, 1) for i, o in zip(x, declared, strict=True)):
        raise ShapeError(f"output 'OUT_0' {list(declared)} must keep input {list(x)}'s rank with each dim equal or 1")
    return {"OUT_0": tuple(declared)}


# ---------------------------------------------------------------------------
# the catalog
# ---------------------------------------------------------------------------


def _build_catalog() -> dict[str, OpSchema]:
    ops: list[OpSchema] = [
        OpSchema("matmul", "matmul", ("A", "B"), (), _fixed("C"), ("C",), {"padding": AttrSchema(AttrKind.FLOAT, default=0.0)}, _matmul_infer),
        _conv("conv_fprop", ("image", "weight"), "Y", _conv_fprop_infer),
        _conv("conv_dgrad", ("loss", "filter"), "DX", _conv_dgrad_infer),
        _conv("conv_wgrad", ("image", "loss"), "DW", _conv_wgrad_infer),
        OpSchema(
            "sdpa", "sdpa", ("q", "k", "v"), ("seq_len_q", "seq_len_kv", "bias", *_PAGED_PORTS, *_DROPOUT_PORTS), _sdpa_outputs, ("O", "Stats"),
            {**_SDPA_ATTRS, "generate_stats": AttrSchema(AttrKind.BOOL, default=False), **_PAGED_ATTRS, **_TRAINING_ATTRS},
            _sdpa_infer, integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)},
            index_bounds={"paged_attention_k_table": ("k", 0), "paged_attention_v_table": ("v", 0)},
            integer_inputs=_DROPOUT_PORTS, ragged_ports=("q", "k", "v", "O"),
        ),
        OpSchema(
            "sdpa_fp8", "sdpa", ("q", "k", "v", *_FP8_SCALES), ("seq_len_q", "seq_len_kv", *_PAGED_PORTS), _sdpa_fp8_outputs, ("O", "Stats", "Amax_S", "Amax_O"),
            {**_SDPA_ATTRS, "generate_stats": AttrSchema(AttrKind.BOOL, default=False), **_PAGED_ATTRS}, _sdpa_fp8_infer,
            integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)},
            index_bounds={"paged_attention_k_table": ("k", 0), "paged_attention_v_table": ("v", 0)},
        ),
        OpSchema(
            "sdpa_backward", "sdpa_backward", ("q", "k", "v", "o", "dO", "stats"), ("seq_len_q", "seq_len_kv", "bias", *_DROPOUT_PORTS),
            _fixed("dQ", "dK", "dV"), ("dQ", "dK", "dV"), {**_SDPA_ATTRS, **_TRAINING_ATTRS}, _sdpa_backward_infer,
            integer_bounds={"seq_len_q": ("q", 2), "seq_len_kv": ("k", 2)}, integer_inputs=_DROPOUT_PORTS,
            optional_outputs=("dBias",), ragged_ports=("q", "k", "v", "o", "dO", "dQ", "dK", "dV"),
        ),
        _norm("layernorm", ("mean", "inv_var"), ()),
        _norm("rmsnorm", ("inv_var",), ("bias",)),
        OpSchema(
            "batchnorm_inference", "norm", ("input", "mean", "inv_variance", "scale", "bias"), (),
            _fixed("Y"), ("Y",), {}, _batchnorm_inference_infer,
        ),
        OpSchema(
            "reduction", "reduction", ("input",), (), _fixed("OUT_0"), ("OUT_0",),
            {"mode": AttrSchema(AttrKind.ENUM, choices=_REDUCTION_MODES, required=True)}, _reduction_infer,
        ),
        *(_pointwise(op, ("input",)) for op in _UNARY),
        *(_pointwise(op, ("a", "b")) for op in _BINARY_AB),
        *(_pointwise(op, ("input0", "input1")) for op in _BINARY_IN01),
        _pointwise("bias", ("input", "bias")),
        _pointwise("scale", ("input", "scale")),
        _pointwise("relu", ("input",), {"negative_slope": _F, "lower_clip": _F, "upper_clip": _F}),
        _pointwise("leaky_relu", ("input",), {"negative_slope": AttrSchema(AttrKind.FLOAT, required=True)}),
        _pointwise("swish", ("input",), {"swish_beta": _F}),
    ]  # fmt: skip
    return {op.name: op for op in ops}


CATALOG: Mapping[str, OpSchema] = _build_catalog()


def schema(op: str) -> OpSchema | None:
    return CATALOG.get(op)


def anchor_family(nodes_ops: list[str]) -> str:
    """The op family that anchors a graph (given its nodes' ops in order):
    the first non-pointwise one, else "pointwise". Statistics count by it."""
    families = [CATALOG[op].family for op in nodes_ops]
    return next((f for f in families if f != "pointwise"), "pointwise")
