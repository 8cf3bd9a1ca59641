"""plancache.functional without a GPU or torch: stand-in tensors (geometry
only), a stand-in client, plancache's stand-in runtime (tests/support/
fake_gpu.py) and stand-in tensor operations (tests/support/frontdoor_standins.py).
What is checked: the spec each function asks for (against specs built by
hand with plancache's builder), the geometry key and the table (a second
call binds its new tensors without asking again; the LRU bound), the
arguments refused and the argument named, and when torch's function runs
instead (counted, logged once). The numerics are tests/gpu/test_gpu_functional.py."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from typing import Any

import pytest

import plancache.functional as pf
from plancache import CompileFailed, CompileOptions, GraphSpec, InvalidRequest, Unavailable, UntrustedPlan
from plancache.frontdoors.service import Once
from plancache.functional import (
    _attention,
    _batch_norm,
    _convolution,
    _linear,
    _norms,
    _paged_decode,
    _requests,
    _table,
    _tensor_ops,
)
from plancache.functional._geometry import Unserved, geo
from plancache.graphspec.layouts import channels_last, row_major
from tests.support.fake_gpu import FakeRuntime
from tests.support.frontdoor_standins import StandInClient, StandInTensor, key_of
from tests.support.processes import child_env
from tests.unit.functional.modes import set_modes

T = StandInTensor
OUT = _requests.OUTPUT_UID


def _hash(request: _requests.Request) -> str:
    return request.spec.spec_hash()


def test_importing_it_imports_neither_torch_nor_the_frontend() -> None:
    code = (
        "import sys, plancache.functional; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cudnn', 'redis'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"


# ---- the specs ---------------------------------------------------------------------------------


def test_linear_is_a_matmul_of_the_collapsed_input_and_the_transposed_weight() -> None:
    x, w, b = T((4, 16, 64)), T((32, 64)), T((32,))
    asked = _linear.linear_request(geo("input", x), geo("weight", w), geo("bias", b), "gelu")
    hand = GraphSpec(io_data_type="half")
    a = hand.tensor([1, 64, 64], name="input", uid=1)
    bt = hand.tensor([1, 64, 32], [2048, 1, 64], name="weight", uid=2)
    hand.gelu(hand.bias(hand.matmul(a, bt), hand.tensor([1, 1, 32], name="bias", uid=3))).set_output(True).set_uid(OUT)
    assert _hash(asked) == hand.spec_hash()
    assert (asked.inputs, asked.outputs[0].shape, asked.outputs[0].stride) == ((1, 2, 3), (4, 16, 32), (512, 32, 1))
    # a [b, s, k] input and its [b*s, k] view are one plan
    assert _hash(_linear.linear_request(geo("input", T((64, 64))), geo("weight", w), geo("bias", b), "gelu")) == _hash(
        asked
    )


def test_linear_layouts_are_strides_not_copies() -> None:
    x = T((16, 64), (1, 16))  # a transposed view
    w = T((32, 64), (1, 32))  # stored transposed: B is row-major
    asked = _linear.linear_request(geo("input", x), geo("weight", w), None, "silu")
    hand = GraphSpec(io_data_type="half")
    y = hand.matmul(
        hand.tensor([1, 16, 64], [1024, 1, 16], name="input", uid=1),
        hand.tensor([1, 64, 32], [2048, 32, 1], name="weight", uid=2),
    )
    hand.swish(y, swish_beta=1.0).set_output(True).set_uid(OUT)
    assert _hash(asked) == hand.spec_hash() and asked.inputs == (1, 2)
    with pytest.raises(Unserved, match=r"input's leading dims .* not one strided axis"):
        _linear.linear_request(geo("input", T((4, 8, 64), (64, 256, 1))), geo("weight", w), None, None)


@pytest.mark.parametrize(
    ("a", "b", "a_spec", "b_spec"),
    [
        (T((8, 16, 64)), T((8, 64, 32)), ([8, 16, 64], [1024, 64, 1]), ([8, 64, 32], [2048, 32, 1])),  # one batch
        (T((8, 16, 64)), T((64, 32), (1, 64)), ([1, 128, 64], [8192, 64, 1]), ([1, 64, 32], [2048, 1, 64])),  # one B
        (T((16, 64)), T((2, 4, 64, 32)), ([1, 16, 64], [1024, 64, 1]), ([8, 64, 32], [2048, 32, 1])),  # one A
    ],
)
def test_matmul_batches(a: Any, b: Any, a_spec: Any, b_spec: Any) -> None:
    hand = GraphSpec(io_data_type="half")
    hand.matmul(hand.tensor(*a_spec, name="input", uid=1), hand.tensor(*b_spec, name="other", uid=2)).set_output(
        True
    ).set_uid(OUT)
    assert _hash(_linear.matmul_request(geo("input", a), geo("other", b))) == hand.spec_hash()


@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_conv2d_bias_relu_follows_torchs_output_format(memory_format: str) -> None:
    layout = channels_last if memory_format == "channels_last" else row_major
    x, w, b = T((16, 64, 56, 56), layout((16, 64, 56, 56))), T((64, 64, 3, 3), layout((64, 64, 3, 3))), T((64,))
    asked = _convolution.conv2d_request(geo("input", x), geo("weight", w), geo("bias", b), 1, 1, 1, 1, True)
    hand = GraphSpec(io_data_type="half")
    conv = hand.conv_fprop(
        hand.tensor(x.shape, x.stride(), name="input", uid=1),
        hand.tensor(w.shape, w.stride(), name="weight", uid=2),
        padding=[1, 1],
        stride=[1, 1],
        dilation=[1, 1],
    )
    hand.relu(hand.bias(conv, hand.tensor([1, 64, 1, 1], name="bias", uid=3))).set_output(True).set_uid(OUT).set_stride(
        layout((16, 64, 56, 56))
    )
    assert _hash(asked) == hand.spec_hash() and asked.outputs[0].stride == layout((16, 64, 56, 56))
    same = _convolution.conv2d_request(
        geo("input", x), geo("weight", w), geo("bias", b), (1, 1), "same", [1, 1], 1, True
    )
    assert _hash(same) == _hash(asked)  # torch's spellings of the same convolution


def test_norms_are_rows_of_the_hidden_size_with_constants_for_what_is_missing() -> None:
    x = T((4, 8, 1024))
    asked = _norms.layer_norm_request(geo("input", x), 1024, geo("weight", T((1024,))), None, 1e-5)
    hand = GraphSpec(io_data_type="half")
    xs, scale = hand.tensor([32, 1024, 1, 1], name="input", uid=1), hand.tensor([1, 1024, 1, 1], name="weight", uid=2)
    y, _, _ = hand.layernorm(
        xs,
        scale,
        hand.tensor([1, 1024, 1, 1], name="bias", uid=3),
        hand.scalar(1e-5, name="epsilon", uid=10),
        norm_forward_phase="INFERENCE",
    )
    assert y is not None
    y.set_output(True).set_uid(OUT)
    assert _hash(asked) == hand.spec_hash() and asked.inputs == (1, 2)
    assert [(c.uid, c.value, c.on_host) for c in asked.constants] == [(3, 0.0, False), (10, 1e-5, True)]
    rms = _norms.rms_norm_request(geo("input", x), (1024,), None, None)
    assert [(c.uid, c.value) for c in rms.constants] == [(2, 1.0), (10, 2.0**-10)]  # torch.finfo(float16).eps
    strided = _norms.rms_norm_request(geo("input", T((32, 1024), (2048, 1))), (1024,), None, 1e-6)
    assert strided.spec.tensors[0].stride == (2048, 1, 1, 1) and strided.outputs[0].stride == (2048, 1)


def test_sdpa_options_are_the_catalogs_attributes_and_ports() -> None:
    q, k, v = T((2, 8, 256, 64)), T((2, 2, 256, 64)), T((2, 2, 256, 64))
    mask, lengths = T((256, 256)), T((2,), dtype="int32")
    asked = _attention.sdpa_request(
        (geo("query", q), geo("key", k), geo("value", v), geo("attn_mask", mask), None, geo("seq_len_kv", lengths)),
        _attention.Attention(dropout_p=0.0, is_causal=False, scale=None, enable_gqa=True, window=128, alibi=False),
    )
    hand = GraphSpec(io_data_type="half")
    tq, tk, tv = (hand.tensor(t.shape, name=n, uid=u) for t, n, u in ((q, "query", 1), (k, "key", 2), (v, "value", 3)))
    seq_q, seq_kv = (
        hand.tensor([2, 1, 1, 1], data_type="int32", name=n, uid=u) for n, u in (("seq_len_q", 5), ("seq_len_kv", 6))
    )
    o, _ = hand.sdpa(
        tq,
        tk,
        tv,
        bias=hand.tensor([1, 1, 256, 256], name="attn_mask", uid=4),
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        use_padding_mask=True,
        attn_scale=1 / math.sqrt(64),
        sliding_window_length=128,
    )
    assert o is not None
    o.set_output(True).set_uid(OUT)
    assert _hash(asked) == hand.spec_hash()
    assert asked.inputs == (1, 2, 3, 4, 6) and [(c.uid, c.value) for c in asked.constants] == [
        (5, 256.0)
    ]  # full query lengths


def test_paged_decode_is_examples_paged_sdpa_at_the_calls_sizes() -> None:
    q, pool, table, lengths = T((8, 8, 1, 128)), T((128, 8, 64, 128)), T((8, 16), dtype="int32"), T((8,), dtype="int32")
    asked = _paged_decode.paged_decode_request(
        geo("query", q),
        geo("key_cache", pool),
        geo("value_cache", pool),
        geo("page_table", table),
        geo("value_page_table", table),
        geo("seq_lens", lengths),
        scale=None,
        max_seq_len=None,
    )
    hand = GraphSpec(io_data_type="half")
    tables = [
        hand.tensor([8, 1, 16, 1], data_type="int32", name=n, uid=u)
        for n, u in (("page_table", 4), ("value_page_table", 5))
    ]
    seq_q, seq_kv = (
        hand.tensor([8, 1, 1, 1], data_type="int32", name=n, uid=u) for n, u in (("seq_len_q", 6), ("seq_lens", 7))
    )
    o, _ = hand.sdpa(
        hand.tensor(q.shape, name="query", uid=1),
        hand.tensor(pool.shape, name="key_cache", uid=2),
        hand.tensor(pool.shape, name="value_cache", uid=3),
        attn_scale=1 / math.sqrt(128),
        use_padding_mask=True,
        seq_len_q=seq_q,
        seq_len_kv=seq_kv,
        paged_attention_max_seq_len_kv=1024,
        paged_attention_k_table=tables[0],
        paged_attention_v_table=tables[1],
    )
    assert o is not None
    o.set_output(True).set_uid(OUT)
    assert _hash(asked) == hand.spec_hash() and asked.inputs == (1, 2, 3, 4, 5, 7)


# ---- the table -----------------------------------------------------------------------------------


def test_a_second_call_of_a_geometry_binds_its_new_tensors_without_asking_again(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    w, b = T((32, 64)), T((32,))
    first, second = T((4, 16, 64)), T((4, 16, 64))
    y1, y2 = pf.linear(first, w, b, activation="relu"), pf.linear(second, w, b, activation="relu")
    assert len(client.asked) == 1 and client.asked[0][2] == CompileOptions()
    (graph,) = runtime.graphs  # deserialized once
    packs = [pack for pack, _, _ in graph.calls]
    assert [p[1] for p in packs] == [first, second] and all(p[2] is w and p[3] is b for p in packs)
    assert [p[OUT] for p in packs] == [y1, y2] and y1.shape == (4, 16, 32) and y1.stride() == (512, 32, 1)
    assert pf.stats()["linear"] == pf.FunctionStats(cudnn=2, torch=0, geometries=1)
    (entry,) = pf.geometries()
    assert entry.function == "linear" and entry.plan is not None and entry.plan.key == key_of(client.asked[0][0])


def test_the_geometry_key_is_shapes_strides_dtypes_devices_and_options(client: StandInClient) -> None:
    w = T((32, 64))
    calls = [
        (T((4, 64)), w, {}),
        (T((4, 64)), w, {}),
        (T((4, 64), (1, 4)), w, {}),
        (T((4, 64), dtype="bfloat16"), T((32, 64), dtype="bfloat16"), {}),
        (T((4, 64)), w, {"activation": "relu"}),
        (T((4, 64), device="cuda:1"), T((32, 64), device="cuda:1"), {}),
    ]
    for x, weight, kwargs in calls:
        pf.linear(x, weight, **kwargs)
    assert len(client.asked) == 5 and len(pf.geometries()) == 5
    assert [ask[0].io_data_type for ask in client.asked] == ["half", "half", "bfloat16", "half", "half"]


def test_the_table_is_a_bounded_lru(client: StandInClient) -> None:
    pf.set_max_geometries(2)
    w = T((32, 64))
    x1, x2, x3 = T((1, 64)), T((2, 64)), T((3, 64))
    for x in (x1, x2, x1, x3):  # x1 used again: x2 is the least recently used when x3 comes
        pf.linear(x, w)
    assert [g.key[1] for g in pf.geometries()] == [(1, 64), (3, 64)]
    pf.linear(x2, w)
    assert len(client.asked) == 4 and _table.TABLE.evicted == 2
    with pytest.raises(InvalidRequest, match="count must be >= 1"):
        pf.set_max_geometries(0)
    pf.set_max_geometries(_table.DEFAULT_MAX_GEOMETRIES)


# ---- arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: pf.linear(T((4, 5)), T((7, 6))),
            "linear: input dims \\(4, 5\\) do not end with weight's in_features \\(6\\)",
        ),
        (
            lambda: pf.linear(T((4, 6)), T((7, 6), dtype="bfloat16")),
            "weight is torch.bfloat16 but input is torch.float16",
        ),
        (
            lambda: pf.linear(T((4, 6)), T((7, 6), device="cpu")),
            "the tensors are on more than one device \\(input on cuda:0, weight on cpu\\)",
        ),
        (lambda: pf.linear(T((4, 6), device="cpu"), T((7, 6), device="cpu")), "linear: input is on the CPU"),
        (
            lambda: pf.linear(T((4, 6)), T((7, 6)), activation="tanh"),
            "linear: activation 'tanh' is not one of None, 'relu', 'gelu', 'silu'",
        ),
        (lambda: pf.matmul(T((4, 6)), T((5, 3))), "input's columns \\(6\\) are not other's rows \\(5\\)"),
        (lambda: pf.conv2d(T((2, 16, 8, 8)), T((8, 4, 3, 3))), "input has 16 channels, weight expects 4"),
        (lambda: pf.layer_norm(T((4, 64)), (32,)), "input dims \\(4, 64\\) do not end with normalized_shape \\(32,\\)"),
        (lambda: pf.rms_norm(T((4, 64)), 64, T((32,))), "weight must have dims \\(64,\\)"),
        (
            lambda: pf.scaled_dot_product_attention(T((2, 8, 16, 64)), T((2, 2, 16, 64)), T((2, 2, 16, 64))),
            "query has 8 heads, key and value 2",
        ),
        (
            lambda: pf.scaled_dot_product_attention(
                T((2, 8, 16, 64)), T((2, 8, 16, 64)), T((2, 8, 16, 64)), alibi=True
            ),
            "alibi=True needs is_causal=True",
        ),
        (
            lambda: pf.scaled_dot_product_attention(
                T((2, 8, 16, 64)), T((2, 8, 16, 64)), T((2, 8, 16, 64)), sliding_window=0
            ),
            "sliding_window must be a positive int",
        ),
        (
            lambda: pf.scaled_dot_product_attention(
                T((2, 8, 16, 64)), T((2, 8, 16, 64)), T((2, 8, 16, 64)), seq_len_kv=T((3,), dtype="int32")
            ),
            "seq_len_kv must have dims \\(2,\\)",
        ),
        (
            lambda: pf.paged_decode_attention(
                T((8, 8, 2, 64)),
                T((64, 8, 16, 64)),
                T((64, 8, 16, 64)),
                T((8, 4), dtype="int32"),
                T((8,), dtype="int32"),
            ),
            "paged_decode_attention: query must be \\[batch, heads, 1, head_dim\\]",
        ),
        (
            lambda: pf.paged_decode_attention(
                T((8, 8, 1, 64)),
                T((64, 3, 16, 64)),
                T((64, 3, 16, 64)),
                T((8, 4), dtype="int32"),
                T((8,), dtype="int32"),
            ),
            "key_cache must be \\[pages, kv_heads, page_size, 64\\] with kv_heads dividing 8",
        ),
        (
            lambda: pf.paged_decode_attention(
                T((8, 8, 1, 64)),
                T((64, 8, 16, 64)),
                T((64, 8, 16, 64)),
                T((4, 4), dtype="int32"),
                T((8,), dtype="int32"),
            ),
            "page_table must be \\[8, pages per sequence\\]",
        ),
        (
            lambda: pf.paged_decode_attention(
                T((8, 8, 1, 64)),
                T((64, 8, 16, 64)),
                T((64, 8, 16, 64)),
                T((8, 4), dtype="int32"),
                T((8,), dtype="int32"),
                max_seq_len=65,
            ),
            "max_seq_len 65 is not in 1..64",
        ),
        (
            lambda: pf.paged_decode_attention(
                T((8, 8, 1, 64)), [], T((64, 8, 16, 64)), T((8, 4), dtype="int32"), T((8,), dtype="int32")
            ),
            "every tensor argument must be a tensor",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_argument(client: StandInClient, call: Any, message: str) -> None:
    """Without torch: InvalidRequest naming the argument (with torch, the
    mistakes torch also refuses raise torch's own error: tests/gpu)."""
    with pytest.raises(InvalidRequest, match=message):
        call()
    assert not client.asked and not pf.geometries()


# ---- when torch runs it ------------------------------------------------------------------------


def test_what_cudnn_is_not_asked_for_runs_torch_counted_and_logged_once(
    client: StandInClient, torch_runs: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    x, w = T((4, 64), dtype="float32"), T((32, 64), dtype="float32")
    assert pf.linear(x, w) == pf.linear(x, w) == "torch linear"
    assert [name for name, _ in torch_runs] == ["linear", "linear"] and not client.asked
    (record,) = caplog.records
    assert (
        "torch runs input (4, 64) torch.float32, weight (32, 64) torch.float32: input is torch.float32"
        in record.getMessage()
    )
    assert pf.stats()["linear"] == pf.FunctionStats(
        cudnn=0,
        torch=2,
        geometries=1,
        torch_geometries=1,
        reasons={record.getMessage().split(": ", 1)[1].split(": ", 1)[1]: 1},
    )
    q = T((2, 8, 16, 64))
    pf.scaled_dot_product_attention(q, q, q, T((16, 16), dtype="bool"))
    pf.scaled_dot_product_attention(T((8, 16, 64)), T((8, 16, 64)), T((8, 16, 64)))
    assert [r for r in pf.stats()["scaled_dot_product_attention"].reasons] == [
        "attn_mask is torch.bool: cuDNN takes an additive bias (plancache.functional makes one of a boolean mask "
        "of a CUDA float16 or bfloat16 call without is_causal)",
        "query, key and value must be 4-D (batch, heads, sequence, head dim)",
    ]


def test_layers_of_one_geometry_torch_runs_each_keep_their_own_batch_norm_statistics(
    client: StandInClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 model's BatchNorm2d layers of one geometry: every call hands torch its own
    running statistics (a table entry of the geometry must not pin the first layer's)."""
    seen: list[tuple[Any, Any]] = []
    monkeypatch.setattr(_tensor_ops, "available", lambda: True)
    monkeypatch.setattr(_batch_norm, "torch_batch_norm", lambda x, mean, var, *rest: seen.append((mean, var)) or x)
    x = T((4, 16, 8, 8), dtype="float32")
    layers = [(T((16,), dtype="float32"), T((16,), dtype="float32")) for _ in range(3)]
    for mean, var in layers * 2:
        assert pf.batch_norm(x, mean, var, training=True) is x
    assert all(got[0] is want[0] and got[1] is want[1] for got, want in zip(seen, layers * 2, strict=True))
    stats = pf.stats()["batch_norm"]
    assert (stats.torch, stats.cudnn, stats.torch_geometries) == (6, 0, 1) and not client.asked


def test_matmul_with_autograd_runs_torch(
    client: StandInClient, torch_runs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """matmul has no served backward (linear has): torch's function runs it with autograd."""
    set_modes(monkeypatch, grad_on=True)
    assert pf.matmul(T((4, 8), requires_grad=True), T((8, 2))) == "torch matmul"
    assert pf.matmul(T((4, 8)), T((8, 2))) != "torch matmul"  # no input requires grad: served
    assert len(client.asked) == 1


def test_what_cudnn_refuses_runs_torch_for_that_geometry(
    client: StandInClient, torch_runs: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    client.error = CompileFailed("cuDNN does not support this graph on sm_90")
    pf.matmul(T((4, 8)), T((8, 2)))
    pf.matmul(T((4, 8)), T((8, 2)))
    pf.matmul(T((6, 8)), T((8, 2)))
    assert len(client.asked) == 2 and len(torch_runs) == 3
    assert len(caplog.records) == 2 and all(
        "CompileFailed: cuDNN does not support" in r.getMessage() for r in caplog.records
    )  # once per geometry


def test_with_the_server_down_torch_runs_said_once_and_asked_again_later(
    client: StandInClient,
    torch_runs: list[Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client.error = Unavailable("failed to connect to all addresses")
    pf.matmul(T((4, 8)), T((8, 2)))
    pf.matmul(T((6, 8)), T((8, 2)))
    assert [r.getMessage() for r in caplog.records] == [
        "plancache.functional: torch runs what plancache cannot serve: Unavailable: failed to connect to all addresses"
    ]
    pf.matmul(T((4, 8)), T((8, 2)))
    assert len(client.asked) == 2  # within the retry delay: the geometry stays with torch
    monkeypatch.setattr(
        _table, "RETRY_AFTER_S", -1.0
    )  # a geometry left to torch from now on is asked for again at once
    pf.matmul(T((6, 8)), T((8, 3)))
    client.error = None
    pf.matmul(T((6, 8)), T((8, 3)))  # the retry delay has passed: this call is torch's, the next asks
    pf.matmul(T((6, 8)), T((8, 3)))
    assert len(client.asked) == 4 and pf.stats()["matmul"].cudnn == 1 and pf.stats()["matmul"].torch == 5


@pytest.mark.parametrize(
    "error", [UntrustedPlan("plan k: signed by an unknown key", signer="x", unknown_key=True), Unavailable("no worker")]
)
def test_a_plan_the_client_refuses_is_never_loaded(
    client: StandInClient, torch_runs: list[Any], runtime: FakeRuntime, error: Exception
) -> None:
    client.error = error  # type: ignore[assignment]
    assert pf.linear(T((4, 64)), T((32, 64))) == "torch linear"
    assert not runtime.graphs and not runtime.handles


def test_without_a_server_torch_runs(runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANCACHE_SERVER", raising=False)
    monkeypatch.setattr(_tensor_ops, "available", lambda: False)
    set_modes(monkeypatch, grad_on=False, compiling=False)
    pf.clear()
    with pytest.raises(
        InvalidRequest,
        match=r"NotConfigured: no plancache server configured.*torch, which would run it, is not installed",
    ):
        pf.linear(T((4, 64)), T((32, 64)))
    pf.clear()


def test_a_plan_that_does_not_load_runs_torch(
    client: StandInClient, torch_runs: list[Any], runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(handle: Any, blob: bytes) -> Any:
        raise RuntimeError("deserialize: not this frontend's format")

    monkeypatch.setattr(runtime, "deserialize", broken)
    assert pf.linear(T((4, 64)), T((32, 64))) == "torch linear"
    assert pf.stats()["linear"].reasons == {
        "the plan did not run: RuntimeError: deserialize: not this frontend's format": 1
    }


def test_logging_keys_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    once = Once()
    once.LIMIT = 2
    log = logging.getLogger("test.once")
    with caplog.at_level(logging.WARNING, logger="test.once"):
        assert [once(log, k, k) for k in ("a", "a", "b", "c", "a")] == [True, False, True, True, True]


def test_a_geometry_this_node_built_runs_its_own_plan_until_the_services_takes_over(
    client: StandInClient, runtime: FakeRuntime
) -> None:
    client.local_plans = True  # a hedged miss the node's own build won
    w = T((32, 64))
    pf.linear(T((4, 16, 64)), w)
    ((_, entry),) = _table.TABLE.entries()
    assert isinstance(entry, _table.HedgedServed) and entry.plan.source == "local" and runtime.graphs == []
    pf.linear(T((4, 16, 64)), w)
    assert runtime.graphs == []  # the service has not answered: still the node's own plan
    assert client.pending is not None
    client.pending.answer()
    pf.linear(T((4, 16, 64)), w)
    ((_, replaced),) = _table.TABLE.entries()
    assert (
        type(replaced) is _table.Served and replaced.plan.source == "compiled"
    )  # a plain entry: later calls look no more
    (graph,) = runtime.graphs
    assert (
        len(graph.calls) == 1
        and client.pending.adoptions == 1
        and pf.stats()["linear"].cudnn == 3
        and len(client.asked) == 1
    )


# ---- what the process tells the service -------------------------------------------------------


def test_every_geometry_is_counted_for_the_service_once_with_its_reason_class(
    client: StandInClient, torch_runs: list[Any]
) -> None:
    """What plancache.functional counts for its reports (plancache.transport.outcomes) is
    what stats() says: geometries served, and each one torch runs under its reason class."""
    from plancache.transport import outcomes

    outcomes.reset_outcome_stats()
    pf.matmul(T((4, 8)), T((8, 2)))
    pf.matmul(T((4, 8)), T((8, 2)))  # a second call of the geometry: not a new graph
    pf.linear(T((4, 64), dtype="float32"), T((32, 64), dtype="float32"))  # cuDNN is not asked for float32
    client.error = CompileFailed("cuDNN does not support this graph on sm_90")
    pf.matmul(T((6, 8)), T((8, 2)))
    client.error = Unavailable("failed to connect to all addresses")
    pf.matmul(T((8, 8)), T((8, 2)))
    counted = {(k.path, k.outcome, k.reason, k.node_type): n for k, n in outcomes.outcome_stats().items()}
    assert counted == {
        ("functional", outcomes.Outcome.SERVED, "", "MATMUL"): 1,
        ("functional", outcomes.Outcome.LOCAL, "not_asked", "MATMUL"): 1,
        ("functional", outcomes.Outcome.LOCAL, "compile_failed", "MATMUL"): 1,
        ("functional", outcomes.Outcome.LOCAL, "unavailable", "MATMUL"): 1,
    }
    stats = pf.stats()
    assert (
        sum(s.geometries - s.torch_geometries for s in stats.values()) == 1
        and sum(sum(s.reasons.values()) for s in stats.values()) == 3
    )
    outcomes.reset_outcome_stats()
