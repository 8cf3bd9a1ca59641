#!/usr/bin/env python3
"""Writes docs/architecture.md from the code, so that it cannot drift: the
processes (the entry points in the two pyproject files), the packages with
what each owns and may import (their `__init__` docstrings, the rules
tests/unit/test_layers.py enforces), their modules (each one's first
docstring line), the imports between packages, the path of a miss and of a
hit (steps naming functions this script finds in the source), and every
Redis key (plancache_server/store/keys.py) with the modules that use it.
tests/unit/test_architecture_doc.py fails when the page is stale.

    python3 scripts/architecture-doc.py
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.imports import ROOTS, may_import, modules, owner  # noqa: E402
from tests.support.markdown import with_contents  # noqa: E402

OUT = ROOT / "docs" / "architecture.md"

# (process, what starts it, what it does). The entry points come from the pyproject files.
PROCESSES = [
    (
        "plancache-server",
        "plancache_server.main",
        "the gRPC gateway (one asyncio loop), its private redis-server unless --redis-url, "
        "and one worker process per local GPU",
    ),
    (
        "plancache-worker",
        "plancache_server.worker_main",
        "a compile worker per GPU, against a deployment's Redis; "
        "started by a server for its own GPUs, or alone on a GPU host",
    ),
    (
        "build process",
        "plancache_server.worker.build_process",
        "a worker's pool (--build-processes): builds heuristic plans and candidates, hands them over serialized",
    ),
    ("plancache", "plancache.cli", "the command line: compile, get, prefetch, stats, warm, export, ... (a Client)"),
    (
        "plancache-server-import",
        "plancache_server.bundle_import",
        "loads a verified bundle of plans into a deployment's store",
    ),
]

# The path of a request, step by step: (module, symbol, what happens).
MISS = [
    (
        "plancache.transport.client",
        "Client.compile",
        "the client normalizes the spec, computes the plan key, looks in its disk cache, calls Compile",
    ),
    (
        "plancache_server.gateway.guard",
        "add_guarded",
        "interceptors: the token, the request's size and shape on the wire, metrics, errors mapped once",
    ),
    (
        "plancache_server.gateway.service",
        "PlanService.compile",
        "resolve the query (validation, key), look the plan up: a miss",
    ),
    (
        "plancache_server.gateway.builds",
        "Builds.join",
        "join this key's flight: take the build lease and queue a job, or follow the build under way",
    ),
    ("plancache_server.store.jobs", "JobQueue.enqueue", "the job goes on its target's stream (bounded)"),
    (
        "plancache_server.worker.job_intake",
        "JobIntake._accept",
        "a worker of the target takes it, derives its key from its spec, marks it running",
    ),
    (
        "plancache_server.worker.build_pool",
        "ProcessBuildPool.submit",
        "its heuristic plan builds in the first build process (callers' lane)",
    ),
    (
        "plancache_server.worker.worker",
        "Worker._on_heuristic",
        "the plan is stored (signed, provisional when tuning follows) and announced; the candidates queue",
    ),
    (
        "plancache_server.gateway.flight",
        "Flight._follow",
        "the flight wakes on the announcement, reads and verifies the plan, answers every waiter",
    ),
    (
        "plancache_server.worker.worker",
        "Worker._finish_tuning",
        "every candidate back: timed on the GPU, the fastest stored under the same key",
    ),
    ("plancache.run.plan", "Plan.execute", "the node deserializes the blob and runs it (or binds it once: Plan.bind)"),
]
HIT = [
    (
        "plancache.transport.client",
        "Client.compile",
        "a plan in the disk cache (verified against its sha256 and signature) costs no call; else Compile",
    ),
    (
        "plancache_server.gateway.service",
        "PlanService.compile",
        "the key resolved (a herd's repeated specs from memory), the plan found",
    ),
    (
        "plancache_server.gateway.memory_cache",
        "MemoryCachedStore.cached",
        "from the gateway's memory of verified plans, or one Redis read verified once",
    ),
    (
        "plancache_server.store.plans",
        "StoredPlan.compile_response",
        "the answer's bytes, serialized once per plan whatever the callers",
    ),
    (
        "plancache.trust.answers",
        "Asked",
        "the client checks the plan is the one it asked for, and its signature, before keeping it",
    ),
]


def symbols(path: Path) -> set[str]:
    """Names defined in a module: functions, classes and their methods (Class.method), module constants."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found.add(node.name)
            found |= {
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def entry_points() -> dict[str, str]:
    found = {}
    for project in (ROOT / "client" / "pyproject.toml", ROOT / "server" / "pyproject.toml"):
        found.update(tomllib.loads(project.read_text())["project"].get("scripts", {}))
    return found


def _first_line(doc: str) -> str:
    return " ".join(doc.split("\n\n", maxsplit=1)[0].split()) if doc else "(no docstring)"


def _owns(doc: str) -> str:
    found = re.search(r"^Owns:\s*(.+?)(?=\nMay import:|\n\n|\Z)", doc, re.MULTILINE | re.DOTALL)
    return " ".join(found.group(1).split()) if found else ""


def render() -> str:
    graph = modules()
    packages = sorted(name for name, m in graph.items() if m.is_package and name not in ("plancache.v1",))
    scripts = entry_points()
    out = [
        "# Architecture",
        "",
        "Written by `python3 scripts/architecture-doc.py` from the code (a test fails when it is stale): "
        "the packages' docstrings, the "
        "imports, the entry points and `plancache_server/store/keys.py`. "
        'The rules of the layers are the packages\' "May import" lines, '
        "checked by tests/unit/test_layers.py; there is no import circle on either side.",
        "",
        "## Processes",
        "",
        "| process | module | what it does |",
        "|---|---|---|",
    ]
    for name, module, what in PROCESSES:
        assert module in graph, f"{module} is not a module"
        listed = [command for command, target in scripts.items() if target.startswith(module + ":")]
        shown = f"`{name}`" + (" (entry point)" if listed else "")
        assert listed or name not in scripts, f"{name}: not an entry point of {module}"
        out.append(f"| {shown} | `{module}` | {what} |")
    out += ["", "## Packages", ""]
    for package in packages:
        module = graph[package]
        if package in ROOTS:
            out += [f"### `{package}`", "", _first_line(module.docstring), ""]
        else:
            rules = may_import(module)
            out += [
                f"### `{package}`",
                "",
                _first_line(module.docstring),
                "",
                f"- Owns: {_owns(module.docstring)}",
                f"- May import: {', '.join(f'`{r}`' for r in rules or []) or 'nothing of ours'}",
                "",
            ]
        members = sorted(name for name in graph if owner(name, packages) == package and name != package)
        if members:
            out += ["| module | what it is |", "|---|---|"]
            out += [f"| `{name.rpartition('.')[2]}` | {_first_line(graph[name].docstring)} |" for name in members]
            out.append("")
    out += [
        "## Imports between packages",
        "",
        "Who imports whom (modules of one package importing modules of another), from the source.",
        "",
    ]
    edges: defaultdict[str, set[str]] = defaultdict(set)
    for name, module in graph.items():
        here = owner(name, packages)
        for target in module.imports:
            there = owner(target, packages)
            if here != there:
                edges[here].add(there)
    out += ["| package | imports |", "|---|---|"]
    out += [
        f"| `{p}` | {', '.join(f'`{t}`' for t in sorted(edges[p])) or '—'} |"
        for p in packages
        if p in edges or graph[p].imports
    ]
    out.append("")
    for title, steps in (("A miss (the first Compile of a graph)", MISS), ("A hit", HIT)):
        out += [f"## {title}", ""]
        for i, (module, symbol, what) in enumerate(steps, 1):
            assert module in graph and symbol in symbols(graph[module].path), f"{module}.{symbol} does not exist"
            out.append(f"{i}. `{module}.{symbol}`: {what}.")
        out.append("")
    out += redis_keys(graph)
    return with_contents("\n".join(out).rstrip() + "\n")


def redis_keys(graph: dict) -> list[str]:
    """Every key name of plancache_server.store.keys: what it is, and the modules that use it."""
    path = graph["plancache_server.store.keys"].path
    tree = ast.parse(path.read_text())
    lines = path.read_text().splitlines()
    described: list[tuple[str, str]] = []
    last_comment = ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            comment = []
            at = node.lineno - 2
            while at >= 0 and lines[at].startswith("#"):
                comment.insert(0, lines[at].lstrip("# "))
                at -= 1
            if comment or (last_comment and lines[node.lineno - 2].strip()):  # one comment above several constants
                last_comment = " ".join(comment) or last_comment
                if node.targets[0].id != "PREFIX":
                    described.append((node.targets[0].id, last_comment))
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
            doc = ast.get_docstring(node) or ""
            if doc.split(":")[0] in ("Hash", "String", "List", "Set", "Sorted set", "Stream") or doc.startswith(
                ("Stream", "Sorted", "String", "Hash", "List", "Set")
            ):
                described.append((f"{node.name}()", " ".join(doc.split())))
    users: defaultdict[str, set[str]] = defaultdict(set)
    for name, module in graph.items():
        if name == "plancache_server.store.keys" or not name.startswith("plancache_server"):
            continue
        for node in ast.walk(ast.parse(module.path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "keys":
                users[node.attr].add(name.removeprefix("plancache_server."))
    out = [
        "## Redis keys",
        "",
        "Every key name is made in `plancache_server/store/keys.py` (nothing else formats one). Keys of one plan carry "
        "the plan key as a hash tag (one shard in a Redis Cluster).",
        "",
        "| key | what it holds | used by |",
        "|---|---|---|",
    ]
    for key, what in described:
        used = sorted(users.get(key.rstrip("()"), set()))
        out.append(f"| `{key}` | {what.replace('|', '/')} | {', '.join(f'`{u}`' for u in used) or '—'} |")
    out.append("")
    return out


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
