"""The layers of both packages (tests/support/imports.py reads the imports).

Each package's `__init__` docstring says what it owns ("Owns:") and what it
may import ("May import:"): that line is the rule checked here, so the rule
and its documentation are one text. Beside them: no import circles at all
(a deferred import inside a function counts; one under TYPE_CHECKING, which
never runs, does not), the client never imports the server, the gateway
and the worker never import each other, and nothing below the web side
imports it.
"""

from __future__ import annotations

import pytest

from tests.support.imports import Module, cycles, may_import, modules, owner

GRAPH = modules()
# Client packages a server has no business with: the wire-level code both need lives in
# plancache.wire and plancache.gpu.
CLIENT_ONLY = (
    "plancache.transport",
    "plancache.functional",
    "plancache.torch",
    "plancache.cudnn",
    "plancache.frontdoors",
    "plancache.cli",
)
UNRULED = {"plancache", "plancache_server", "plancache.v1"}  # the roots (public API, entry points) and protoc's stubs
PACKAGES = {name: m for name, m in GRAPH.items() if m.is_package}
RULED = {name: m for name, m in PACKAGES.items() if name not in UNRULED}


def _allowed(target: str, rules: list[str]) -> bool:
    return any(target == rule or target.startswith(rule + ".") for rule in rules)


def test_there_is_no_import_circle() -> None:
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("package", sorted(RULED))
def test_every_package_says_what_it_owns_and_may_import(package: str) -> None:
    doc = RULED[package].docstring
    assert "Owns:" in doc and may_import(RULED[package]) is not None, (
        f"{package}/__init__.py needs 'Owns:' and 'May import:' lines"
    )


@pytest.mark.parametrize("package", sorted(RULED))
def test_each_package_imports_only_what_its_docstring_allows(package: str) -> None:
    rules = may_import(RULED[package]) or []
    inside = [m for m in GRAPH.values() if owner(m.name, RULED) == package]
    wrong = sorted(f"{m.name} -> {t}" for m in inside for t in m.imports if not _allowed(t, [package, *rules]))
    assert not wrong, f"{package} may import {', '.join(rules)}, not:\n" + "\n".join(wrong)


def _imports_of(prefix: str) -> list[tuple[str, str]]:
    return [
        (m.name, t) for m in GRAPH.values() if m.name == prefix or m.name.startswith(prefix + ".") for t in m.imports
    ]


@pytest.mark.parametrize(
    ("importer", "never"),
    [
        ("plancache", "plancache_server"),
        ("plancache_server.gateway", "plancache_server.worker"),
        ("plancache_server.worker", "plancache_server.gateway"),
        ("plancache_server.store", "plancache_server.web"),
        ("plancache_server.gateway", "plancache_server.web"),
        ("plancache_server.worker", "plancache_server.web"),
        ("plancache_server.store", "plancache_server.gateway"),
        ("plancache_server.store", "plancache_server.worker"),
        # The two no-spec front doors stand on what they share, never on each other.
        ("plancache.cudnn", "plancache.functional"),
        ("plancache.functional", "plancache.cudnn"),
        ("plancache.frontdoors", "plancache.functional"),
        ("plancache.frontdoors", "plancache.cudnn"),
        # Wire-level code is below every client package that speaks it.
        ("plancache.wire", "plancache.transport"),
        ("plancache.wire", "plancache.run"),
        ("plancache.gpu", "plancache.run"),
        # The server reads the shared packages, never the client's own (its calls, its front doors).
        *((server, client) for server in ("plancache_server",) for client in CLIENT_ONLY),
    ],
)
def test_the_layers_hold(importer: str, never: str) -> None:
    wrong = [f"{a} -> {b}" for a, b in _imports_of(importer) if b == never or b.startswith(never + ".")]
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_deferred_imports() -> None:
    """The checker counts an import inside a function (a circle hidden that way still fails)."""
    run = GRAPH["plancache.transport.calls"]
    assert "plancache.gpu.target" in run.imports  # imported inside resolve_target(), at call time


def test_the_module_list_is_whole() -> None:
    assert {
        "plancache_server.gateway.builds",
        "plancache_server.worker.worker",
        "plancache_server.store.keys",
        "plancache_server.web.status",
        "plancache.graphspec.graph",
        "plancache.keys.plankey",
        "plancache.run.plan",
        "plancache.trust.signing",
        "plancache.transport.client",
        "plancache.wire.rich_status",
        "plancache.frontdoors.service",
        "plancache.gpu.target",
    } <= GRAPH.keys()
    assert all(isinstance(m, Module) for m in GRAPH.values())
