"""Compilers turn a normalized GraphSpec into a serialized, autotuned plan.

`cudnn` is the real one (GPU worker processes only). `load_compiler` also
accepts `module:factory`, which is how tests and benchmarks plug in their
stand-in compiler without the product importing test code.
"""

from __future__ import annotations

import importlib

from plancache_server.compiler.base import CandidateResult, CompiledPlan, Compiler

__all__ = ["CandidateResult", "CompiledPlan", "Compiler", "load_compiler"]


def load_compiler(name: str, device: int, autotune_strategy: str = "screened") -> Compiler:
    if name == "cudnn":
        from plancache_server.compiler.cudnn import CudnnCompiler

        return CudnnCompiler(device, autotune_strategy)
    module_name, _, attr = name.partition(":")
    if not attr:
        raise ValueError(f"compiler {name!r}: expected 'cudnn' or 'module:factory'")
    factory = getattr(importlib.import_module(module_name), attr)
    compiler: Compiler = factory(device)
    return compiler
