"""The classic ops' rules: pointwise (every mode), matmul, convolutions,
the norms plancache has always served and reduction. Each knows its shape
rule, so a spec with a rank or shape mismatch is refused before anything is
allocated on a GPU, and its results' dims and strides are written into the
normal form (plancache.graphspec.layouts). The SDPA family's are in attention.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from plancache.graphspec import rules
from plancache.graphspec.schema import (
    AttrKind,
    AttrSchema,
    AttrValue,
    Dims,
    InferFn,
    OpSchema,
    OutputsFn,
    ShapeError,
    broadcast,
    declared_or,
    fixed,
    need_rank,
)

# ---------------------------------------------------------------------------
# pointwise
# ---------------------------------------------------------------------------


def _pointwise_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    return {"OUT_0": declared_or(outs.get("OUT_0"), broadcast(list(ins.items())), "OUT_0")}


def _pointwise(name: str, ports: tuple[str, ...], attrs: Mapping[str, AttrSchema] | None = None) -> OpSchema:
    return OpSchema(
        name=name,
        family="pointwise",
        inputs=ports,
        optional_inputs=(),
        outputs_for=fixed("OUT_0"),
        all_outputs=("OUT_0",),
        attributes=attrs or {},
        infer=_pointwise_infer,
    )


_INTS = AttrSchema(AttrKind.INT_LIST)

# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------


def _matmul_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    a, b = ins["A"], ins["B"]
    need_rank("A", a, at_least=2)
    need_rank("B", b, at_least=2)
    if len(a) != len(b):
        raise ShapeError(f"A {list(a)} and B {list(b)} must have the same rank (batch dims broadcast over size 1)")
    if a[-1] != b[-2]:
        raise ShapeError(f"A {list(a)} @ B {list(b)}: inner dims differ ({a[-1]} != {b[-2]})")
    batch = broadcast([("A batch", a[:-2]), ("B batch", b[:-2])]) if len(a) > 2 else ()
    return {"C": declared_or(outs.get("C"), (*batch, a[-2], b[-1]), "C")}


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
            raise ShapeError(
                f"attribute {name!r} has {len(value)} values but the convolution has {spatial} spatial dims"
            )
        return [int(v) for v in value if isinstance(v, int)]

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
                f"spatial axis {i}: filter {weight[i + 2]} (dilated {effective}) "
                f"does not fit input {image[i + 2]} with padding {pre[i]}+{post[i]}"
            )
        out.append(size)
    return tuple(out)


def _check_channels(image: Dims, weight: Dims, image_port: str, weight_port: str) -> None:
    if len(image) < 3 or len(weight) != len(image):
        raise ShapeError(
            f"{image_port!r} {list(image)} and {weight_port!r} {list(weight)} must share a rank >= 3 (N, C, spatial...)"
        )
    if weight[1] < 1 or image[1] % weight[1] != 0:
        raise ShapeError(
            f"{image_port!r} has {image[1]} channels, not a multiple of {weight_port!r}'s {weight[1]} input channels"
        )


def _conv_complete(ins: Mapping[str, Dims], attrs: dict[str, AttrValue]) -> None:
    first = next(iter(ins.values()))
    spatial = max(len(first) - 2, 0)
    if "pre_padding" not in attrs and "post_padding" not in attrs:
        attrs.setdefault("padding", (0,) * spatial)
    attrs.setdefault("stride", (1,) * spatial)
    attrs.setdefault("dilation", (1,) * spatial)


def _conv_fprop_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    _check_channels(ins["image"], ins["weight"], "image", "weight")
    return {"Y": declared_or(outs.get("Y"), conv_output_dims(ins["image"], ins["weight"], attrs), "Y")}


def _conv_dgrad_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    loss, filt = ins["loss"], ins["filter"]
    declared = outs.get("DX")
    if declared is None:
        raise ShapeError("output 'DX' needs explicit dims: a strided convolution's input size is ambiguous")
    _check_channels(declared, filt, "DX", "filter")
    if conv_output_dims(declared, filt, attrs) != tuple(loss):
        raise ShapeError(
            f"convolving DX {list(declared)} with filter {list(filt)} gives "
            f"{list(conv_output_dims(declared, filt, attrs))}, not loss {list(loss)}"
        )
    return {"DX": tuple(declared)}


def _conv_wgrad_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    image, loss = ins["image"], ins["loss"]
    declared = outs.get("DW")
    if declared is None:
        raise ShapeError("output 'DW' needs explicit dims (the filter size cannot be inferred)")
    _check_channels(image, declared, "image", "DW")
    if declared[0] != loss[1]:
        raise ShapeError(f"DW {list(declared)} has {declared[0]} output channels but loss {list(loss)} has {loss[1]}")
    if conv_output_dims(image, declared, attrs) != tuple(loss):
        raise ShapeError(
            f"convolving image {list(image)} with DW {list(declared)} gives "
            f"{list(conv_output_dims(image, declared, attrs))}, not loss {list(loss)}"
        )
    return {"DW": tuple(declared)}


def _conv(name: str, ports: tuple[str, str], out: str, infer: InferFn) -> OpSchema:
    return OpSchema(
        name=name,
        family="conv",
        inputs=ports,
        optional_inputs=(),
        outputs_for=fixed(out),
        all_outputs=(out,),
        attributes=_CONV_ATTRS,
        infer=infer,
        complete=_conv_complete,
    )


# ---------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------

_PHASE = AttrSchema(AttrKind.ENUM, choices=("TRAINING", "INFERENCE"), required=True, enum_type="norm_forward_phase")


def _check_param(port: str, dims: Dims, expected: Dims) -> None:
    if tuple(dims) != tuple(expected):
        raise ShapeError(f"input {port!r} must have dims {list(expected)}, got {list(dims)}")


def _check_scalar(ins: Mapping[str, Dims], port: str) -> None:
    if port in ins and any(d != 1 for d in ins[port]):
        raise ShapeError(f"input {port!r} must be a scalar (all dims 1), got {list(ins[port])}")


def _check_norm_param(port: str, dims: Dims, x: Dims) -> None:
    """A norm's scale or bias: x's rank, 1 on the batch axis and on every axis
    the norm does not normalize, x's extent on the others (the frontend's rule)."""
    if len(dims) != len(x) or dims[0] != 1 or any(d not in (1, e) for d, e in zip(dims, x, strict=True)):
        raise ShapeError(
            f"input {port!r} {list(dims)} must have input {list(x)}'s rank, "
            "1 on axis 0 and each other dim 1 or the input's"
        )


def _norm_infer(stats: tuple[str, ...]) -> InferFn:
    def infer(
        ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], attrs: Mapping[str, AttrValue]
    ) -> dict[str, Dims]:
        x = ins["input"]
        need_rank("input", x, at_least=2)
        for port in ("scale", "bias"):
            if port in ins:
                _check_norm_param(port, ins[port], x)
        _check_scalar(ins, "epsilon")
        result = {"Y": declared_or(outs.get("Y"), x, "Y")}
        if attrs.get("norm_forward_phase") == "TRAINING":
            # The frontend's rule: x's dims, 1 wherever the scale is not 1 (past the batch axis without one).
            stat = rules.dims({"norm_stats": 0}, ins, attrs, {})
            assert stat is not None
            for port in stats:
                result[port] = declared_or(outs.get(port), stat, port)
        return result

    return infer


def _norm_outputs(stats: tuple[str, ...]) -> OutputsFn:
    return lambda attrs, _ports: ("Y", *stats) if attrs.get("norm_forward_phase") == "TRAINING" else ("Y",)


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
        output_presence={port: {"param_is": ["norm_forward_phase", "TRAINING"]} for port in stats},
    )


def _batchnorm_inference_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    x = ins["input"]
    need_rank("input", x, at_least=2)
    per_channel = (1, x[1], *([1] * (len(x) - 2)))
    for port in ("mean", "inv_variance", "scale", "bias"):
        _check_param(port, ins[port], per_channel)
    return {"Y": declared_or(outs.get("Y"), x, "Y")}


# ---------------------------------------------------------------------------
# reduction
# ---------------------------------------------------------------------------

_REDUCTION_MODES = ("ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS")


def _reduction_infer(
    ins: Mapping[str, Dims], outs: Mapping[str, Dims | None], _a: Mapping[str, AttrValue]
) -> dict[str, Dims]:
    x, declared = ins["input"], outs.get("OUT_0")
    if declared is None:
        raise ShapeError("output 'OUT_0' needs explicit dims (size 1 on every reduced axis)")
    if len(declared) != len(x) or any(o not in (i, 1) for i, o in zip(x, declared, strict=True)):
        raise ShapeError(f"output 'OUT_0' {list(declared)} must keep input {list(x)}'s rank with each dim equal or 1")
    return {"OUT_0": tuple(declared)}


# ---------------------------------------------------------------------------
# the classic ops
# ---------------------------------------------------------------------------


def classic_ops(pointwise_modes: Mapping[str, tuple[tuple[str, ...], Mapping[str, AttrSchema]]]) -> list[OpSchema]:
    """Every classic op; the pointwise modes (ports and attributes, the
    frontend's) are given by the catalog, which reads them from the frontend."""
    return [
        OpSchema(
            "matmul",
            "matmul",
            ("A", "B"),
            (),
            fixed("C"),
            ("C",),
            {"padding": AttrSchema(AttrKind.FLOAT, default=0.0)},
            _matmul_infer,
        ),
        _conv("conv_fprop", ("image", "weight"), "Y", _conv_fprop_infer),
        _conv("conv_dgrad", ("loss", "filter"), "DX", _conv_dgrad_infer),
        _conv("conv_wgrad", ("image", "loss"), "DW", _conv_wgrad_infer),
        # The frontend takes a norm without a scale or a bias (cudnn-frontend #188): both optional.
        _norm("layernorm", ("mean", "inv_var"), ("scale", "bias")),
        _norm("rmsnorm", ("inv_var",), ("scale", "bias")),
        OpSchema(
            "batchnorm_inference",
            "norm",
            ("input", "mean", "inv_variance", "scale", "bias"),
            (),
            fixed("Y"),
            ("Y",),
            {},
            _batchnorm_inference_infer,
        ),
        OpSchema(
            "reduction",
            "reduction",
            ("input",),
            (),
            fixed("OUT_0"),
            ("OUT_0",),
            {"mode": AttrSchema(AttrKind.ENUM, choices=_REDUCTION_MODES, required=True, enum_type="reduction_mode")},
            _reduction_infer,
        ),
        *(_pointwise(mode, ports, attrs) for mode, (ports, attrs) in pointwise_modes.items()),
    ]
