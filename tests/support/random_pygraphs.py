"""Random graphs built with the cuDNN frontend's own API, as programs build
them: every node family plancache serves, with random shapes, data types,
attributes (the SDPA's masks, bounds and dropout forms, norms' phases,
slices ...), uids set or left to the frontend (0 included), results' dims
and strides set or not, scalars held in the graph, and the graph's
constructor arguments. The property tests capture each one, rebuild it
from the spec and compare (tests/unit/test_frontend_graph.py on the CPU
with the frontend's IR, tests/gpu/test_gpu_frontend_graph.py on the GPU
with cuDNN's own lowering).

`random_graph(cudnn, seed)` -> (graph, family). One family per graph (what
a GPU can lower and validate); shapes stay small.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

Builder = Callable[[Any, Any, random.Random], None]


def _row_major(dims: list[int]) -> list[int]:
    return [math.prod(dims[i + 1 :]) for i in range(len(dims))]


def _nhwc(dims: list[int]) -> list[int]:
    _, c, h, w = dims
    return [h * w * c, 1, w * c, c]


class _Maker:
    """Tensors of one graph, with uids set at random (0 included) or left to the frontend."""

    def __init__(self, g: Any, cudnn: Any, rng: random.Random) -> None:
        self.g, self.cudnn, self.rng = g, cudnn, rng
        self.used: set[int] = set()

    def uid(self) -> int | None:
        if self.rng.random() < 0.4:
            choice = self.rng.choice([0, 0, 7, 100, 2**20 + self.rng.randrange(1000), -3])
            if choice not in self.used:
                self.used.add(choice)
                return choice
        return None

    def tensor(
        self, name: str, dims: list[int], data_type: Any, *, nhwc: bool = False, stride: bool = True, **kwargs: Any
    ) -> Any:
        strides = _nhwc(dims) if nhwc else _row_major(dims)
        t = self.g.tensor(
            name=name, dim=dims, stride=strides if stride or nhwc else None, data_type=data_type, **kwargs
        )
        uid = self.uid()
        if uid is not None:
            t.set_uid(uid)
        return t

    def output(
        self, t: Any, data_type: Any | None = None, *, dims: list[int] | None = None, nhwc: bool = False
    ) -> None:
        t.set_output(True)
        if data_type is not None:
            t.set_data_type(data_type)
        uid = self.uid()
        if uid is not None:
            t.set_uid(uid)
        if dims is not None and self.rng.random() < 0.5:  # set as a program may: dims, and maybe strides
            t.set_dim(dims)
            if self.rng.random() < 0.5:
                t.set_stride(_nhwc(dims) if nhwc else _row_major(dims))


def _types(cudnn: Any, rng: random.Random) -> tuple[Any, Any]:
    io = rng.choice([cudnn.data_type.HALF, cudnn.data_type.BFLOAT16])
    return io, cudnn.data_type.FLOAT


def _matmul(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    b, mm, k, n = rng.choice([1, 2, 4]), rng.choice([64, 128]), rng.choice([64, 128]), rng.choice([64, 256])
    a, w = m.tensor("A", [b, mm, k], io), m.tensor("B", [b, k, n], io)
    y = m.g.matmul(A=a, B=w, compute_data_type=f32)
    tail = rng.choice(["none", "bias_relu", "gelu", "swish", "leaky"])
    if tail == "bias_relu":
        bias = m.tensor("bias", [1, 1, n], io)
        y = m.g.relu(input=m.g.bias(input=y, bias=bias), lower_clip=rng.choice([None, 0.0]))
    elif tail == "gelu":
        y = m.g.gelu(input=y)
    elif tail == "swish":
        y = m.g.swish(input=y, swish_beta=rng.choice([None, 1.0, 1.5]))
    elif tail == "leaky":
        y = m.g.leaky_relu(input=y, negative_slope=0.01)
    m.output(y, io)


def _conv(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    n, c, k, hw = rng.choice([1, 2]), rng.choice([16, 32]), rng.choice([16, 32]), rng.choice([8, 16])
    x, w = m.tensor("x", [n, c, hw, hw], io, nhwc=True), m.tensor("w", [k, c, 3, 3], io, nhwc=True)
    y = m.g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=f32)
    if rng.random() < 0.4:  # conv + genstats, as test_conv_genstats
        s, sq = m.g.genstats(input=y, compute_data_type=f32)
        m.output(y, io, dims=[n, k, hw, hw], nhwc=True)
        m.output(s, f32)
        m.output(sq, f32)
        return
    y = m.g.relu(input=m.g.bias(input=y, bias=m.tensor("b", [1, k, 1, 1], io, nhwc=True)))
    if rng.random() < 0.4:  # a scalar held in the graph (tensor_scalar), int or float
        y = m.g.mul(
            a=y,
            b=m.g.tensor_scalar(rng.choice([0.5, 2.0, 3]), rng.choice(list(cudnn.scalar_type.__members__.values()))),
        )
    m.output(y, io, dims=[n, k, hw, hw], nhwc=True)


def _norm_forward(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    kind = rng.choice(["layernorm", "rmsnorm", "instancenorm", "adalayernorm", "batchnorm"])
    n, c = rng.choice([4, 8]), rng.choice([32, 64])
    x = m.tensor("x", [n, c, 4, 4] if kind in ("instancenorm", "batchnorm") else [n, c, 1, 1], io, nhwc=True)
    per = [1, c, 1, 1]
    scale = m.tensor("scale", [n, c, 1, 1] if kind == "adalayernorm" else per, f32, nhwc=True)
    bias = m.tensor("bias", [n, c, 1, 1] if kind == "adalayernorm" else per, f32, nhwc=True)
    eps = m.tensor("eps", [1, 1, 1, 1], f32, is_pass_by_value=True)
    training = rng.random() < 0.6
    phase = cudnn.norm_forward_phase.TRAINING if training else cudnn.norm_forward_phase.INFERENCE
    if kind == "batchnorm":
        running = rng.random() < 0.5
        mean_in, var_in = (m.tensor(nm, per, f32, nhwc=True) for nm in ("rm", "rv")) if running else (None, None)
        momentum = m.tensor("momentum", [1, 1, 1, 1], f32, is_pass_by_value=True) if running else None
        outs = m.g.batchnorm(
            input=x,
            scale=scale,
            bias=bias,
            in_running_mean=mean_in,
            in_running_var=var_in,
            epsilon=eps,
            momentum=momentum,
        )
    elif kind == "rmsnorm":
        outs = m.g.rmsnorm(
            norm_forward_phase=phase, input=x, scale=scale, epsilon=eps, bias=bias if rng.random() < 0.5 else None
        )
    else:
        outs = getattr(m.g, kind)(norm_forward_phase=phase, input=x, scale=scale, bias=bias, epsilon=eps)
    outs = outs if isinstance(outs, list) else [outs]
    for i, t in enumerate(outs):
        if t is not None:
            m.output(t, io if i == 0 else f32)


def _norm_backward(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    kind = rng.choice(
        [
            "layernorm_backward",
            "rmsnorm_backward",
            "batchnorm_backward",
            "instancenorm_backward",
            "adalayernorm_backward",
        ]
    )
    n, c = rng.choice([4, 8]), rng.choice([32, 64])
    spatial = kind in ("batchnorm_backward", "instancenorm_backward")
    dims = [n, c, 4, 4] if spatial else [n, c, 1, 1]
    x, dy = m.tensor("x", dims, io, nhwc=True), m.tensor("dy", dims, io, nhwc=True)
    stats = (
        [1, c, 1, 1]
        if kind == "batchnorm_backward"
        else [n, c, 1, 1]
        if kind == "instancenorm_backward"
        else [n, 1, 1, 1]
    )
    scale = m.tensor("scale", [n, c, 1, 1] if kind == "adalayernorm_backward" else [1, c, 1, 1], f32, nhwc=True)
    inv = m.tensor("inv_var", stats, f32, nhwc=True)
    if kind == "rmsnorm_backward":
        outs = m.g.rmsnorm_backward(grad=dy, input=x, inv_variance=inv, scale=scale, has_dbias=rng.random() < 0.5)
    else:
        mean = m.tensor("mean", stats, f32, nhwc=True)
        outs = getattr(m.g, kind)(grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv)
    for i, t in enumerate(outs):
        if t is not None:
            m.output(t, io if i == 0 else f32)


def _structural(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, _ = _types(cudnn, rng)
    kind = rng.choice(["rope", "rope_backward", "slice", "concatenate", "transpose", "reshape"])
    b, h, s, d = 2, 4, rng.choice([16, 32]), 64
    x = m.tensor("x", [b, h, s, d], io)
    if kind in ("rope", "rope_backward"):
        freqs = m.tensor("freqs", [1, 1, s, d], cudnn.data_type.FLOAT)
        port = "input" if kind == "rope" else "dY"
        y = getattr(m.g, kind)(
            **{port: x}, freqs=freqs, output_scale=rng.choice([1.0, 0.5]), rope_dim=rng.choice([0, d])
        )
    elif kind == "slice":
        y = m.g.slice(x, slices=[slice(None), slice(0, 2), slice(0, s, rng.choice([1, 2])), slice(None)])
    elif kind == "concatenate":
        y = m.g.concatenate(inputs=[x, m.tensor("x2", [b, h, s, d], io)], axis=rng.choice([1, 2]))
    elif kind == "transpose":
        y = m.g.transpose(x, permutation=[0, 2, 1, 3])
    else:
        y = m.g.reshape(x)
        y.set_dim([b, h * s, d]).set_stride([h * s * d, d, 1])
    m.output(y, io)


def _sdpa(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    b, h, s, d = rng.choice([1, 2]), rng.choice([2, 4]), rng.choice([64, 128]), rng.choice([64, 128])
    q, k, v = (m.tensor(n, [b, h, s, d], io) for n in ("q", "k", "v"))
    kwargs: dict[str, Any] = {"attn_scale": rng.choice([0.125, 1 / math.sqrt(d)])}
    mask = rng.choice(["none", "causal", "bottom_right", "window", "band", "alibi"])
    if mask == "causal":
        kwargs["use_causal_mask"] = True
    elif mask == "bottom_right":
        kwargs["use_causal_mask_bottom_right"] = True
    elif mask == "window":
        kwargs.update(use_causal_mask=True, sliding_window_length=rng.choice([16, 32]))
    elif mask == "band":
        kwargs.update(
            diagonal_alignment=rng.choice(list(cudnn.diagonal_alignment.__members__.values())),
            diagonal_band_right_bound=0,
        )
        if rng.random() < 0.5:
            kwargs["diagonal_band_left_bound"] = 16
    elif mask == "alibi":
        kwargs.update(use_causal_mask=True, use_alibi_mask=True)
    if rng.random() < 0.3:
        kwargs.update(
            use_padding_mask=True,
            seq_len_q=m.tensor("seq_q", [b, 1, 1, 1], cudnn.data_type.INT32),
            seq_len_kv=m.tensor("seq_kv", [b, 1, 1, 1], cudnn.data_type.INT32),
        )
    training = rng.random() < 0.5
    if rng.random() < 0.5:  # the catalog's spelling, or the frontend's classic switch
        kwargs["generate_stats"] = training
    else:
        kwargs["is_inference"] = not training
    if training and rng.random() < 0.3:
        seed, offset = (m.tensor(n, [1, 1, 1, 1], cudnn.data_type.INT64) for n in ("seed", "offset"))
        kwargs["dropout"] = (0.1, seed, offset)
    if rng.random() < 0.5:  # the backward instead: its inputs are the forward's
        o, do = m.tensor("o", [b, h, s, d], io), m.tensor("dO", [b, h, s, d], io)
        stats = m.tensor("stats", [b, h, s, 1], f32)
        kwargs.pop("generate_stats", None)
        kwargs.pop("is_inference", None)
        for t in m.g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=stats, **kwargs):
            m.output(t, io)
        return
    if rng.random() < 0.3:  # tensors the caller makes and hands the op as outputs (test_mhas_v2 gives them uids)
        for port in ("score_max", "score_sum_exp"):
            given = m.tensor(port, [b, h, s, 1], f32)
            given.set_output(True)
            kwargs[port] = given
    o, st = m.g.sdpa(q=q, k=k, v=v, **kwargs)
    m.output(o, io, dims=[b, h, s, d])
    if st is not None:
        m.output(st, f32)


def _score_mod(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    """A flexible SDPA (test_flexible_sdpa): a callback adds pointwise ops to
    the scores, reading graph tensors it closes over (a softcap, -inf)."""
    io, f32 = _types(cudnn, rng)
    b, h, s, d = 1, rng.choice([2, 4]), rng.choice([64, 128]), 64
    q, k, v = (m.tensor(n, [b, h, s, d], io) for n in ("q", "k", "v"))
    cap = m.tensor("softcap", [1, 1, 1, 1], f32, is_pass_by_value=True)
    neg_inf = m.tensor("neg_inf", [1, 1, 1, 1], f32, is_pass_by_value=True)
    softcap, causal = rng.random() < 0.6, rng.random() < 0.6

    def score_mod(graph: Any, score: Any) -> Any:
        if softcap:
            score = graph.mul(a=graph.tanh(input=graph.div(a=score, b=cap)), b=cap)
        if causal:
            row = graph.gen_index(input=score, axis=2)
            row.set_data_type(cudnn.data_type.INT32)
            col = graph.gen_index(input=score, axis=3)
            col.set_data_type(cudnn.data_type.INT32)
            mask = graph.cmp_ge(input=row, comparison=col, compute_data_type=cudnn.data_type.BOOLEAN)
            mask.set_data_type(cudnn.data_type.BOOLEAN)
            score = graph.binary_select(input0=score, input1=neg_inf, mask=mask)
        return score

    training = rng.random() < 0.5
    o, st = m.g.sdpa(q=q, k=k, v=v, attn_scale=1 / math.sqrt(d), generate_stats=training, score_mod=score_mod)
    m.output(o, io)
    if st is not None:
        m.output(st, f32)


def _pointwise(m: _Maker, cudnn: Any, rng: random.Random) -> None:
    io, f32 = _types(cudnn, rng)
    dims = [2, rng.choice([32, 64]), 64]
    a, b = m.tensor("a", dims, io), m.tensor("b", dims, io)
    kind = rng.choice(["select", "add_square", "relu_backward", "gen_index", "reduction"])
    if kind == "select":
        y = m.g.binary_select(input0=a, input1=b, mask=m.g.cmp_gt(input=a, comparison=b))
    elif kind == "add_square":
        y = m.g.add_square(a=a, b=b)
    elif kind == "relu_backward":
        y = m.g.relu_backward(loss=a, input=b, lower_clip=0.0)
    elif kind == "gen_index":
        y = m.g.add(a=a, b=m.g.gen_index(input=b, axis=2))
    else:
        y = m.g.reduction(input=m.g.mul(a=a, b=b), mode=cudnn.reduction_mode.ADD)
        y.set_dim([2, dims[1], 1]).set_stride([dims[1], 1, 1])
        m.output(y, f32)
        return
    m.output(y, io)


FAMILIES: dict[str, Builder] = {
    "matmul": _matmul,
    "conv": _conv,
    "norm_forward": _norm_forward,
    "norm_backward": _norm_backward,
    "structural": _structural,
    "sdpa": _sdpa,
    "score_mod": _score_mod,
    "pointwise": _pointwise,
}


def graph_arguments(cudnn: Any, rng: random.Random, kernel_cache: Any = None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if rng.random() < 0.2:
        found["sm_count"] = rng.choice([66, 132])
    if rng.random() < 0.1:
        found["sm_version"] = 90
    if rng.random() < 0.1:
        found["is_override_shape_enabled"] = True
    if rng.random() < 0.1 and kernel_cache is not None:
        found.update(kernel_cache=kernel_cache, is_dynamic_shape_enabled=True)
    if rng.random() < 0.1:
        found["is_cuda_graph_replay_expected"] = True
    return found


def random_graph(
    cudnn: Any,
    seed: int,
    *,
    kernel_cache: Any = None,
    family: str | None = None,
    pygraph: Any = None,
    handle: Any = None,
) -> tuple[Any, str]:
    rng = random.Random(seed)
    family = family or rng.choice(sorted(FAMILIES))
    extra = {"handle": handle} if handle is not None else {}
    g = (pygraph or cudnn.pygraph)(
        name=f"random-{seed}",
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        **graph_arguments(cudnn, rng, kernel_cache),
        **extra,
    )
    FAMILIES[family](_Maker(g, cudnn, rng), cudnn, rng)
    return g, family
