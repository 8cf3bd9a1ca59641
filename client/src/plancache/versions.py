"""The versions a program reports (`--version` on every console command, the server's plancache_build_info
metric): its distribution's, Python's, and the GPU stack's as installed (torch, the cuDNN frontend and the
cuDNN backend a worker would build with). Read from the packages' metadata: nothing of the stack is imported
and no GPU is touched, so `--version` is instant anywhere, a gateway without the [gpu] extra included.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
from collections.abc import Callable, Sequence
from typing import Any

NOT_INSTALLED = "not installed"
# What a worker builds with: the name shown, the distributions that may provide it (first found wins) and
# the module it is imported as (a copy installed without package metadata is still found).
STACK: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("cudnn_frontend", ("nvidia-cudnn-frontend",), "cudnn"),
    ("cudnn", ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn"), ""),
    ("torch", ("torch",), "torch"),
)
_SHOWN = {"cudnn_frontend": "cuDNN frontend", "cudnn": "cuDNN wheel", "torch": "torch"}


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def stack_versions() -> dict[str, str]:
    """{"cudnn_frontend": ..., "cudnn": ..., "torch": ...}: each version, "installed" when only its module is
    found, NOT_INSTALLED otherwise."""
    found: dict[str, str] = {}
    for key, distributions, module in STACK:
        versions = (distribution_version(d) for d in distributions)
        version = next((v for v in versions if v != NOT_INSTALLED), NOT_INSTALLED)
        if version == NOT_INSTALLED and module and importlib.util.find_spec(module) is not None:
            version = "installed"
        found[key] = version
    return found


def version_line(program: str, distribution: str, *, stack: bool = False) -> str:
    """ "plancache 0.1.0 (Python 3.12.3)"; with `stack`, the GPU stack a worker here would build with too."""
    parts = [f"Python {platform.python_version()}"]
    if distribution != "plancache":
        parts.append(f"plancache {distribution_version('plancache')}")
    if stack:
        parts.append("builds with " + ", ".join(f"{_SHOWN[k]} {v}" for k, v in stack_versions().items()))
    return f"{program} {distribution_version(distribution)} ({'; '.join(parts)})"


class VersionAction(argparse.Action):
    """`--version`: print `line()` and exit 0, the line made only when asked (it reads package metadata)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str = argparse.SUPPRESS,
        default: Any = argparse.SUPPRESS,
        help: str = "print the version (and the GPU stack's, on a server) and exit",
        line: Callable[[], str] = lambda: "",
    ) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)
        self.line = line

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(self.line())  # on standard output, as argparse's own version action prints
        parser.exit()


def add_version(parser: argparse.ArgumentParser, program: str, distribution: str, *, stack: bool = False) -> None:
    parser.add_argument(
        "--version", action=VersionAction, line=lambda: version_line(program, distribution, stack=stack)
    )
