"""plancache's operators on CUDA tensors, their repeated calls replayed in C++ (csrc/kernels.cpp).

An operator's Python implementation costs the dispatcher's call into Python
(~7 µs) before any of plancache's own work, on every call: most of what a
compiled program pays per operator over torch's kernels. The extension
registers one C++ kernel for the CUDA key of every plancache operator. A
call it has not seen runs the Python implementation, through `learn_call`,
which also collects every cuDNN launch that call made (plancache.
functional._table.LAUNCH_LOG); the kernel keeps the call where replaying
those launches reproduces it exactly (kernels.cpp says the rules), and
replays it for every later call of the same arguments' geometry. Python's
geometry table changing clears what it keeps.

It also registers the training operators' autograd in C++ (`install_gradients`:
the Autograd key, from the same plancache.torch._ops.Gradient Python's
torch.library registration reads), so an eager training call runs no
autograd.Function; and with it on, plancache.torch.mode() routes eager calls
to the operators rather than to plancache.functional's Python autograd.

Settings (`PLANCACHE_NATIVE`):
  0 (default)     never: every call runs the Python implementation. GPU run 49 (H100) verified the kept
                  calls bit for bit and measured them (30-40 % less host time a call, compiled models
                  1.15-1.44x torch's step against 1.39-1.72x), but found them failing under
                  torch.compile(mode="reduce-overhead") (their workspace kept from the CUDA graphs' pool);
                  fixed since (plancache.run's workspace pool), passed in GPU run 50 with the C++
                  autograd. Still off: the mode's eager calls through the operators are not raced against
                  torch's functions (plancache.functional._race), and run 50 measured eager ResNet-50
                  inference slower through them (one pair of processes).
  auto            use the extension where it is built for this torch and Python; where it is not, build
                  it on a background thread (one C++ file, ~1 min of one core, once per node: the build is
                  cached under PLANCACHE_NATIVE_DIR, default ~/.cache/plancache/native) and use it from
                  then on. The Python implementations serve every call meanwhile, and for good where the
                  build fails (no compiler, no headers: the reason is in native_state() and logged once).
  1               build now if needed, and fail loudly if it cannot be had.
`python -m plancache.torch.native` builds it ahead (a node image's step).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plancache.functional._table import LAUNCH_LOG, NATIVE_DRAINS, TABLE, stream_workspace

log = logging.getLogger("plancache.torch")

NATIVE_ENV = "PLANCACHE_NATIVE"
NATIVE_DIR_ENV = "PLANCACHE_NATIVE_DIR"
SOURCE = Path(__file__).with_name("csrc") / "kernels.cpp"
DEFAULT = "0"  # until a GPU run verifies them under CUDA graphs (the docstring)


def setting() -> str:
    value = os.environ.get(NATIVE_ENV, DEFAULT).strip().lower() or DEFAULT
    if value not in ("auto", "0", "1"):
        raise ValueError(f"{NATIVE_ENV} must be auto, 0 or 1, got {value!r}")
    return value


def learn_call(implementation: Callable[..., Any], args: tuple[Any, ...], learning: bool) -> tuple[Any, list[Any]]:
    """The kernel's call of an operator's Python implementation: its result, and (learning) every launch it made."""
    if not learning:
        return implementation(*args), []
    outer = LAUNCH_LOG.launches
    launches: list[Any] = []
    LAUNCH_LOG.launches = launches
    try:
        return implementation(*args), launches
    finally:
        LAUNCH_LOG.launches = outer


def module_name() -> str:
    """The extension's name: its source, torch's version and Python's (a build for another is not loaded)."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version_info[:2]}|{sys.implementation.cache_tag}".encode())
    return f"plancache_native_{digest.hexdigest()[:16]}"


def build_directory(name: str) -> Path:
    root = os.environ.get(NATIVE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "plancache", "native")
    return Path(root) / name


def _built(name: str) -> Path | None:
    found = sorted(build_directory(name).glob(f"{name}*.so"))
    return found[0] if found else None


def _import(name: str, path: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build(verbose: bool = False) -> Any:
    """Build (or find) the extension and import it.

    Each process builds in a folder of its own and moves the library into place (an atomic rename): torch's
    own build lock would make a process wait, without a bound, on a lock file a killed build left behind. Two
    processes starting at once on a node may each build it once."""
    name = module_name()
    path = _built(name)
    if path is not None:
        return _import(name, path)
    import shutil

    from torch.utils import cpp_extension

    directory = build_directory(name)
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / f"build-{os.getpid()}-{threading.get_ident()}"
    private.mkdir(exist_ok=True)
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(SOURCE)],
            build_directory=str(private),
            extra_cflags=["-O2"],
            extra_ldflags=["-ldl"],
            with_cuda=False,
            verbose=verbose,
        )
        (library,) = private.glob(f"{name}*.so")
        os.replace(library, directory / library.name)  # the loaded library stays mapped
        module.__file__ = str(directory / library.name)  # where it is now (its build folder goes below)
        return module
    finally:
        shutil.rmtree(private, ignore_errors=True)


def install_gradients(module: Any, operators: Sequence[Any]) -> list[str]:
    """The extension's C++ autograd for every training operator (`operator.gradient`: plancache.torch._ops.Gradient,
    the description Python's registration reads too), over Python's: an eager training call's autograd without
    Python. The names installed; `module.remove_autograd()` gives the operators back to Python's."""
    installed = []
    try:
        for op in operators:
            g = getattr(op, "gradient", None)
            if g is not None:
                module.install_autograd(op.name, g.backward, list(g.arguments), list(g.of), list(g.non_differentiable))
                installed.append(op.name)
    except BaseException:
        module.remove_autograd()  # all or none: Python's registration serves every operator again
        raise
    return installed


class Native:
    """The extension in this process: loaded once, its kernels installed for the operators."""

    def __init__(self) -> None:
        self.module: Any = None
        self.state = "off"  # off | building | on | failed: <why>
        self._lock = threading.Lock()
        self._operators: Sequence[Any] = ()

    def start(self, operators: Sequence[Any], wanted: str | None = None) -> None:
        """Called at the first operator call on a CUDA tensor: load, or build in the background, per the setting
        (`wanted`: in its place). Later calls return at the state's read (an operator's miss path calls it)."""
        if self.state != "off":
            return
        with self._lock:
            if self.state != "off":
                return
            self._operators = operators
            wanted = wanted or setting()
            if wanted == "0":
                self.state = "disabled (PLANCACHE_NATIVE=0)"
                return
            if wanted == "1" or _built(module_name()) is not None:
                self._load()
                if wanted == "1" and self.state != "on":
                    raise RuntimeError(f"plancache: {NATIVE_ENV}=1 and the native kernels are {self.state}")
                return
            self.state = "building"
        threading.Thread(target=self._load, name="plancache-native-build", daemon=True).start()

    def _load(self) -> None:
        try:
            module = build()
            if not module.load_cudnn(""):
                self.state = "failed: cuDNN's library is not loaded in this process"
                return
            module.set_learn_call(learn_call)
            module.set_workspace(stream_workspace)
            for op in self._operators:
                module.install(op.name, op.implementation, "CUDA")
            install_gradients(module, self._operators)
            TABLE.on_change = module.clear
            # The kept calls hold the frontend's plan objects: released before the interpreter ends. (The
            # frontend's module still reports objects as leaked at exit when calls were kept: GPU run 49, call 3;
            # what else holds them is not found.)
            atexit.register(module.clear)
            NATIVE_DRAINS.append(self.drain)
            self.module, self.state = module, "on"
            log.info("plancache: native operator kernels on")
        except Exception as e:  # a node without a compiler or headers: the Python implementations serve
            self.state = f"failed: {type(e).__name__}: {e}"
            log.warning("plancache: native operator kernels not available (%s); Python serves every call", e)

    def drain(self) -> dict[str, int]:
        """Calls replayed in C++ since the last drain, by function (plancache.functional.stats() adds them)."""
        module = self.module
        return dict(module.drain_calls()) if module is not None else {}

    def info(self) -> dict[str, Any]:
        module = self.module
        return {"state": self.state, **(dict(module.counts()) if module is not None else {})}


NATIVE = Native()


def main() -> None:
    """`python -m plancache.torch.native`: build the extension ahead (a node image's step); prints where it is."""
    module = build(verbose="-v" in sys.argv[1:])
    print(module.__file__)


if __name__ == "__main__":
    main()
