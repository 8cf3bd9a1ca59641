"""Where a served ResNet-50 inference step's extra time goes (GPU run 53): torch's model and a served copy, races
settled, then (1) one step of each under torch.profiler: kernels by name and count, CUDA and CPU totals; (2) each
plan-run conv layer alone, 200 calls back to back, served against torch's copy (host µs a call); (3) the output
strides of each served conv against torch's. Prints a report; writes nothing."""

from __future__ import annotations

import collections
import copy
import time

import torch
import torchvision

import plancache.torch as pt
from plancache.torch import _serve


def main() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().half().to(memory_format=torch.channels_last).eval()
    served = pt.serve(copy.deepcopy(model))
    x = torch.randn(32, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        start = time.perf_counter()
        while time.perf_counter() - start < 2.5:
            served(x)
            model(x)
        torch.cuda.synchronize()
        for name, net in (("torch", model), ("served", served)):
            times = []
            for _ in range(5):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(20):
                    net(x)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) / 20 * 1e3)
            print(f"{name}: step {sorted(times)[2]:.3f} ms")
        kernels: dict[str, collections.Counter[str]] = {}
        for name, net in (("torch", model), ("served", served)):
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                net(x)
                torch.cuda.synchronize()
            counts: collections.Counter[str] = collections.Counter()
            cuda_us = 0.0
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    counts[e.name[:90]] += 1
                    cuda_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            kernels[name] = counts
            print(f"{name}: {sum(counts.values())} kernels, {cuda_us:.0f} µs on the device")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        for k in sorted(set(kernels["torch"]) | set(kernels["served"])):
            a, b = kernels["torch"][k], kernels["served"][k]
            if a != b:
                print(f"  kernel count differs: torch {a} served {b}: {k}")
        layers = [
            (name, m, dict(model.named_modules())[name])
            for name, m in served.named_modules()
            if isinstance(m, torch.nn.Conv2d)
        ]
        inputs: dict[str, torch.Tensor] = {}
        hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: inputs.__setitem__(n, a[0])) for n, m, _ in layers]
        served(x)
        for h in hooks:
            h.remove()
        for name, mine, theirs in layers:
            xi = inputs.get(name)
            if xi is None:
                print(f"{name}: not called (returned: {not _serve.served(mine)})")
                continue
            a, b = mine(xi), theirs(xi)
            rows = []
            for net in (mine, theirs, mine, theirs):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(200):
                    net(xi)
                issued = time.perf_counter()
                torch.cuda.synchronize()
                rows.append(((issued - t) / 200 * 1e6, (time.perf_counter() - t) / 200 * 1e6))
            print(
                f"{name}: served={_serve.served(mine)} host {rows[2][0]:.1f} vs {rows[3][0]:.1f} µs, "
                f"total {rows[2][1]:.1f} vs {rows[3][1]:.1f}; strides {a.stride()} vs {b.stride()} "
                f"in {tuple(xi.stride())}"
            )
        print(pt.stats())


if __name__ == "__main__":
    main()
