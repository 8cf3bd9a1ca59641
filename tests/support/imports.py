"""The import graph of plancache's two packages, read from the source (ast):
what tests/unit/test_layers.py checks and scripts/architecture-doc.py draws.

Every import counts, at module level or deferred inside a function, except
those under `if TYPE_CHECKING:` (they never run). Only edges between modules
of `plancache` and `plancache_server` are kept.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {
    "plancache": REPO / "client" / "src" / "plancache",
    "plancache_server": REPO / "server" / "src" / "plancache_server",
}
GENERATED = ("plancache.v1",)  # protoc's stubs


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    docstring: str
    imports: set[str] = field(default_factory=set)  # modules of ours it imports


def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for root in ROOTS.values():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            if name.startswith(GENERATED):
                continue
            tree = ast.parse(path.read_text(), str(path))
            found[name] = Module(name, path, is_package, ast.get_docstring(tree) or "")
            found[name].imports = set(_imported(tree, name, is_package))
    for module in found.values():
        resolved = {_resolve(target, found) for target in module.imports}
        module.imports = {name for name in resolved if name is not None and name != module.name}
    return found


def _imported(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    skipped = {id(n) for n in _type_checking_blocks(tree)}
    for node in _walk(tree, skipped):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, is_package)
            if base is None:
                continue
            # `from p import x`: the module p.x if there is one, else p (x is defined there).
            yield from (f"{base}.{a.name}" for a in node.names)


def _walk(node: ast.AST, skipped: set[int]) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if id(child) in skipped:
            continue
        yield child
        yield from _walk(child, skipped)


def _type_checking_blocks(tree: ast.AST) -> Iterable[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from node.body


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    package = name.split(".") if is_package else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _resolve(target: str, found: dict[str, Module]) -> str | None:
    """The module of ours an imported name lives in (a module, or the package that defines the name)."""
    if not target.startswith(tuple(ROOTS)) or target.startswith(GENERATED):
        return None
    while target and target not in found:
        target = target.rpartition(".")[0]
    return target or None


def cycles(graph: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v].imports):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The last lines of a package docstring; the list may wrap over several lines (up to a blank line or the end).
_MAY_IMPORT = re.compile(r"^May import:\s*(.+?)\.?\s*(?:\n\s*\n|\Z)", re.MULTILINE | re.DOTALL)


def may_import(package: Module) -> list[str] | None:
    """The packages a package's docstring allows it to import (its "May import:" line)."""
    found = _MAY_IMPORT.search(package.docstring)
    if found is None:
        return None
    text = " ".join(found.group(1).split())
    return [] if text.lower() in ("nothing", "nothing of ours") else [p.strip().strip("`") for p in text.split(",")]


def owner(module: str, packages: Iterable[str]) -> str:
    """The most specific package (of `packages`) a module belongs to."""
    best = ""
    for package in packages:
        if (module == package or module.startswith(package + ".")) and len(package) > len(best):
            best = package
    return best
