# ruff: noqa: E741, N806, PLR0402
"""The cuDNN frontend walkthrough's sections 5 and 6 (SDPA with causal
masking; serialize, reload, execute by uid), their code verbatim from
shared/reference/cudnn-frontend-walkthrough.txt below the marker line. The
one line changed is `import plancache.cudnn as cudnn` (was `import cudnn`).
The helpers the sections call (build, tensor_of, workspace_for, bench,
report, section ...) are written as shared/reference/h200_baseline.py
writes them. Run by tests/gpu/test_gpu_frontend_shim.py through
run_program.py, in a process of its own."""

import math
import statistics
import time

import torch

import plancache.cudnn as cudnn

DEV = "cuda"
DTYPE = torch.float16
_MAJOR, _MINOR = torch.cuda.get_device_capability()
SM = _MAJOR * 10 + _MINOR
HAS_SDPA = SM >= 80
TORCH2CUDNN = {
    torch.float16: cudnn.data_type.HALF,
    torch.bfloat16: cudnn.data_type.BFLOAT16,
    torch.float32: cudnn.data_type.FLOAT,
}
HANDLE = cudnn.create_handle()
cudnn.set_stream(HANDLE, torch.cuda.current_stream().cuda_stream)


def section(title):
    def run(fn):
        print(f"\n=== {title}")
        return fn

    return run


def tensor_of(g, t, name):
    return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=TORCH2CUDNN[t.dtype])


def build(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)


def workspace_for(g):
    return torch.empty(max(g.get_workspace_size(), 1), device=DEV, dtype=torch.uint8)


def bench(fn, launches=20, reps=5):
    """Milliseconds per call: launches per event pair, median of reps."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)


def tflops(flops, ms):
    return flops / ms / 1e9


def report(label, ms, flops):
    print(f"    {label:34s}: {ms:.4f} ms  {tflops(flops, ms):.1f} TFLOP/s")


# ---- the walkthrough, sections 5 and 6, verbatim ------------------------------
@section("5. SDPA (Flash Attention) with causal masking")
def sdpa_demo():
    if not HAS_SDPA:
        raise RuntimeError(f"fused SDPA needs SM80+ (Ampere), this GPU is sm_{SM}")
    b, h, s, d = 4, 16, 1024, 64
    scale = 1.0 / math.sqrt(d)
    SDPA_FLOPS = 4 * b * h * s * s * d * 0.5
    q = torch.randn(b, h, s, d, device=DEV, dtype=DTYPE)
    k = torch.randn(b, h, s, d, device=DEV, dtype=DTYPE)
    v = torch.randn(b, h, s, d, device=DEV, dtype=DTYPE)
    o = torch.empty(b, h, s, d, device=DEV, dtype=DTYPE)
    g = cudnn.pygraph(
        handle=HANDLE,
        name="sdpa",
        io_data_type=TORCH2CUDNN[DTYPE],
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    Q, Kt, V = tensor_of(g, q, "Q"), tensor_of(g, k, "K"), tensor_of(g, v, "V")
    causal = True
    try:
        O, _stats = g.sdpa(name="sdpa", q=Q, k=Kt, v=V, is_inference=True, attn_scale=scale, use_causal_mask=True)
    except TypeError:
        try:
            O, _stats = g.sdpa(
                name="sdpa",
                q=Q,
                k=Kt,
                v=V,
                is_inference=True,
                attn_scale=scale,
                diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
                right_bound=0,
            )
        except Exception:
            causal = False
            O, _stats = g.sdpa(name="sdpa", q=Q, k=Kt, v=V, is_inference=True, attn_scale=scale)
    print(f"    causal masking: {causal}")
    O.set_output(True).set_data_type(TORCH2CUDNN[DTYPE])
    O.set_dim(list(o.size())).set_stride(list(o.stride()))
    build(g)
    ws = workspace_for(g)
    pack = {Q: q, Kt: k, V: v, O: o}
    g.execute(pack, ws)
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    rel = ((o.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    print(f"    shape   : b{b} h{h} s{s} d{d}   workspace {ws.numel() / 1024:.1f} KiB")
    print(f"    rel err : {rel:.2e}")
    ms = bench(lambda: g.execute(pack, ws))
    ms_t = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))
    print()
    report("cuDNN FE SDPA", ms, SDPA_FLOPS)
    report("torch SDPA (backend's choice)", ms_t, SDPA_FLOPS)
    print("    Note: torch may already be dispatching to cuDNN or FlashAttention,")
    print("    so parity here is the expected, healthy outcome.")
    return f"{ms:.3f} ms, {tflops(SDPA_FLOPS, ms):.1f} TFLOP/s"


sdpa_demo()


@section("6. Serialize a built graph, reload it, execute by UID")
def serialization():
    Bsz, M, Kd, Nd = 8, 256, 512, 256
    a = torch.randn(Bsz, M, Kd, device=DEV, dtype=DTYPE)
    bm = torch.randn(Bsz, Kd, Nd, device=DEV, dtype=DTYPE)
    out = torch.empty(Bsz, M, Nd, device=DEV, dtype=DTYPE)
    UID_A, UID_B, UID_C = 1, 2, 3
    g = cudnn.pygraph(
        handle=HANDLE,
        name="serializable_mm",
        io_data_type=TORCH2CUDNN[DTYPE],
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    A = tensor_of(g, a, "A").set_uid(UID_A)
    Bt = tensor_of(g, bm, "B").set_uid(UID_B)
    C = g.matmul(A=A, B=Bt, compute_data_type=cudnn.data_type.FLOAT)
    C.set_output(True).set_data_type(TORCH2CUDNN[DTYPE]).set_uid(UID_C)
    t0 = time.perf_counter()
    build(g)
    cold_ms = (time.perf_counter() - t0) * 1e3
    blob = g.serialize()
    print(f"    cold build      : {cold_ms:.1f} ms")
    print(f"    serialized plan : {len(blob)} bytes (cache this to disk / ship it)")
    t0 = time.perf_counter()
    g2 = cudnn.pygraph()
    try:
        g2.deserialize(HANDLE, blob)
    except TypeError:
        g2.deserialize(blob)
    warm_ms = (time.perf_counter() - t0) * 1e3
    print(f"    deserialize     : {warm_ms:.1f} ms  -> {cold_ms / max(warm_ms, 1e-6):.1f}x faster startup")
    ws = torch.empty(max(g2.get_workspace_size(), 1), device=DEV, dtype=torch.uint8)
    g2.execute({UID_A: a, UID_B: bm, UID_C: out}, ws, handle=HANDLE)
    torch.cuda.synchronize()
    ref = torch.bmm(a.float(), bm.float())
    rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    print(f"    rel err after reload: {rel:.2e}")
    return f"{len(blob)} B blob, reload {cold_ms / max(warm_ms, 1e-6):.1f}x faster than rebuild"


serialization()
