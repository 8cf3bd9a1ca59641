"""Compilers turn a normalized GraphSpec into a serialized, autotuned plan.

`cudnn` is the real one (GPU worker processes only). `load_compiler` also
accepts `module:factory`, which is how tests and benchmarks plug in their
stand-in compiler without the product importing test code.

Owns: turning a spec into plans on one GPU.
May import: plancache, plancache_server.settings, plancache_server.worker.compiler.
"""

from __future__ import annotations

import importlib

from plancache_server.worker.compiler.base import CandidateResult, CompiledPlan, Compiler

__all__ = ["CandidateResult", "CompiledPlan", "Compiler", "load_compiler"]


def load_compiler(name: str, device: int, autotune_strategy: str = "screened") -> Compiler:
    if name == "cudnn":
        from plancache_server.worker.compiler.cudnn import CudnnCompiler

        return CudnnCompiler(device, autotune_strategy)
    module_name, _, attr = name.partition(":")
    if not attr:
        raise ValueError(f"compiler {name!r}: expected 'cudnn' or 'module:factory'")
    factory = getattr(importlib.import_module(module_name), attr)
    compiler: Compiler = factory(device)
    return compiler
