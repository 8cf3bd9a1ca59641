"""Deprecated name of `plancache.graphspec` (renamed in issue 39): `import
plancache.spec.family` and `from plancache.spec import GraphSpec` keep
working, with a DeprecationWarning, and give the graphspec modules
themselves (one module object under two names, never a second copy).

Owns: nothing (an alias).
May import: plancache.graphspec.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

from plancache.graphspec import GraphSpec, Node, Tensor

_OLD = __name__ + "."
_NEW = "plancache.graphspec."

warnings.warn(
    "plancache.spec is now plancache.graphspec (CHANGELOG.md, issue 39); the old name will be removed",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `plancache.spec.<x>` as the module `plancache.graphspec.<x>` already is."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_NEW + spec.name.removeprefix(_OLD))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its own name."""


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
__path__: list[str] = []  # a package to the import system, its submodules found by _Alias


def __getattr__(name: str) -> ModuleType:
    """`plancache.spec.family` as an attribute, as after `import plancache.spec.family`."""
    try:
        return importlib.import_module(_NEW + name)
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = ["GraphSpec", "Node", "Tensor"]
