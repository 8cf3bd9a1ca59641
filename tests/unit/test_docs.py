"""The README and the docs pages hold together: the README stays short,
every long page has a current table of contents, every link, file path and
module they name exists, the code they show uses names and arguments the
API has, the error table covers every error class, every PLANCACHE_*
variable the code reads is documented, and the commands they give exist."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import os
import re
import shlex
import textwrap
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from plancache import AdminClient, Client, GraphSpec, Plan, errors
from tests.support.markdown import CONTENTS_START, anchors, with_contents

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# README.md and docs/*.md; docs/gpu-runs/ holds records of runs, kept as they were written.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
CONTENTS_FROM_LINES = 80
# Things named in the docs that another branch of issue 40 brings; once merged this is empty.
# Paths the docs name that a run writes (ignored by git), not files of the repository.
OUTPUTS = ("build/",)
# Where a path the docs name may start: the repository, a package's source folder, a package.
SOURCE_ROOTS = (
    ROOT,
    ROOT / "client" / "src",
    ROOT / "server" / "src",
    ROOT / "client" / "src" / "plancache",
    ROOT / "server" / "src" / "plancache_server",
)
PATH_SUFFIXES = (".py", ".md", ".json", ".yml", ".yaml", ".sh", ".png", ".mjs", ".toml", ".txt", ".proto", ".js")
# The standard Apache-2.0 text (https://www.apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out, in_code = [], False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        if not in_code:
            out.append(line)
    return "\n".join(out)


def _blocks(text: str, language: str) -> Iterator[str]:
    """The fenced code blocks of one language, indented ones included."""
    for m in re.finditer(r"^( *)```" + language + r"\n(.*?)^\1```", text, re.S | re.M):
        yield textwrap.dedent(m.group(2))


def _links(text: str) -> Iterator[str]:
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", _prose(text)):
        yield m.group(1)


def test_the_readme_is_short() -> None:
    lines = README.read_text().split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference material to docs/"
    assert not [n for n, line in enumerate(lines, 1) if len(line) > 200 and not line.startswith("|")], (
        "README.md has lines over 200 characters"
    )


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_long_pages_have_a_current_table_of_contents(page: Path) -> None:
    text = page.read_text()
    if page != README and len(text.split("\n")) < CONTENTS_FROM_LINES:
        return
    assert CONTENTS_START in text, f"{_rel(page)} has no table of contents: run scripts/sync-readme.py"
    assert with_contents(text) == text, (
        f"{_rel(page)}'s table of contents is not its headings: run scripts/sync-readme.py "
        "(docs/architecture.md, docs/performance.md: their own scripts)"
    )


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    dangling = []
    for link in _links(text):
        if re.match(r"^[a-z]+:", link):
            continue
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists() or not path.is_relative_to(ROOT):
            dangling.append(link)
        elif fragment and path.suffix == ".md" and fragment not in anchors(path.read_text()):
            dangling.append(f"{link} (no such heading)")
    assert not dangling, f"{_rel(page)} links to what does not exist: {dangling}"


def _path_words(text: str) -> Iterator[str]:
    """What a page names as a file of the repository: inline code, plain words and shell commands."""
    prose = _prose(text)
    spans = re.findall(r"`([^`\n]+)`", prose)
    plain = re.sub(r"`[^`\n]*`", " ", re.sub(r"!?\[[^\]]*\]\([^)]*\)", " ", prose))
    plain = re.sub(r"\b[a-z+]+://\S+", " ", plain)
    words = [w for span in spans for w in span.split()] + plain.split()
    words += [w for block in _blocks(text, "sh") for w in block.split()]
    for raw in words:
        word = raw.strip("()[],;:.'\"")
        if re.match(r"^[\w][\w.*+-]*(/[\w.*+-]+)+/?$", word) and (word.endswith("/") or word.endswith(PATH_SUFFIXES)):
            yield word
        elif re.match(r"^[\w.-]+\.md$", word):
            yield word  # a page named alone (DESIGN.md): it must be one of the repository's


@cache
def _file_names() -> set[str]:
    names = set()
    for _folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("node_modules", "__pycache__")]
        names.update(files)
    return names


def _exists(word: str) -> bool:
    if word.startswith(OUTPUTS):
        return True
    if "/" not in word:
        return word in _file_names()
    return any(any(base.glob(word.rstrip("/"))) if "*" in word else (base / word).exists() for base in SOURCE_ROOTS)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_file_paths_named_exist(page: Path) -> None:
    missing = sorted({w for w in _path_words(page.read_text()) if not _exists(w)})
    assert not missing, f"{_rel(page)} names files that are not in the repository: {missing}"


def _defines(path: Path, names: list[str]) -> bool:
    """Whether a module defines a name (a function, class or variable; `Class.method` one level down)."""
    return _defined_in(ast.parse(path.read_text()).body, names)


def _defined_in(body: list[ast.stmt], names: list[str]) -> bool:
    name, rest = names[0], names[1:]
    if rest:
        return any(
            isinstance(node, ast.ClassDef) and node.name == name and _defined_in(node.body, rest) for node in body
        )
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def _module_reference_resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    base = ROOT / ("client" if parts[0] == "plancache" else "server") / "src"
    for cut in range(len(parts), 0, -1):
        stem = base.joinpath(*parts[:cut])
        module = stem / "__init__.py" if stem.is_dir() else stem.with_suffix(".py")
        if module.exists():
            rest = parts[cut:]
            return not rest or (len(rest) <= 2 and _defines(module, rest))
    return False


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_modules_named_exist(page: Path) -> None:
    named = set(re.findall(r"`((?:plancache|plancache_server)(?:\.\w+)+)(?:\(\))?`", page.read_text()))
    missing = sorted(d for d in named if not _module_reference_resolves(d))
    assert not missing, f"{_rel(page)} names modules or functions that do not exist: {missing}"


# What the examples' variables are, by name.
KNOWN_OBJECTS: dict[str, Any] = {"client": Client, "plan": Plan, "g": GraphSpec}


def _instance_attributes(cls: type) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {
        t.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _has(owner: Any, attr: str) -> bool:
    return hasattr(owner, attr) or (inspect.isclass(owner) and attr in _instance_attributes(owner))


def _check_call(func: Any, call: ast.Call, where: str, problems: list[str]) -> None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    args = [None] * len(call.args)
    if inspect.isfunction(func) and "." in func.__qualname__ and not isinstance(func, staticmethod):
        args = [None, *args]  # an unbound method: self
    try:
        signature.bind(*args, **{k.arg: None for k in call.keywords if k.arg})
    except TypeError as e:
        problems.append(f"{where}: {e}")


def _owner_of(node: ast.expr, names: dict[str, Any]) -> Any:
    """What an expression of the example is: a module or class it imported, or a known variable's class."""
    if isinstance(node, ast.Name):
        return names.get(node.id, KNOWN_OBJECTS.get(node.id))
    if isinstance(node, ast.Attribute):
        owner = _owner_of(node.value, names)
        if owner is Client and node.attr == "admin":
            return AdminClient
        if inspect.ismodule(owner) and hasattr(owner, node.attr):
            return getattr(owner, node.attr)
    return None


def _check_block(code: str, where: str) -> list[str]:
    problems: list[str] = []
    tree = ast.parse(code)
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("plancache"):
                    continue  # torch and the like: not what these pages document
                top = alias.name.split(".")[0]
                try:
                    module = importlib.import_module(alias.name)  # a submodule: an attribute of its package from now
                except ImportError as e:
                    if e.name and not e.name.startswith("plancache"):
                        continue  # needs a package this machine lacks (plancache.torch without torch)
                    raise
                names[alias.asname or top] = module if alias.asname else importlib.import_module(top)
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{where}: {node.module} has no {alias.name}")
                else:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    names = {k: v for k, v in names.items() if not (inspect.ismodule(v) and not v.__name__.startswith("plancache"))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = _owner_of(node.value, names)
            if owner is not None and (inspect.ismodule(owner) or inspect.isclass(owner)) and not _has(owner, node.attr):
                problems.append(f"{where}: {getattr(owner, '__name__', owner)} has no {node.attr}")
        if isinstance(node, ast.Call):
            func = _owner_of(node.func, names)
            if func is None and isinstance(node.func, ast.Attribute):
                owner = _owner_of(node.func.value, names)
                func = getattr(owner, node.func.attr, None) if inspect.isclass(owner) else None
            if callable(func):
                _check_call(func, node, f"{where}: {ast.unparse(node.func)}(...)", problems)
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_code_examples_use_what_the_api_has(page: Path) -> None:
    pytest.importorskip("cudnn", reason="plancache.cudnn's examples need the cuDNN frontend's module")
    problems = []
    for n, block in enumerate(_blocks(page.read_text(), "python"), 1):
        problems += _check_block(block, f"{_rel(page)} python block {n}")
    assert not problems, problems


def test_the_example_checker_finds_a_wrong_name_and_a_wrong_argument() -> None:
    code = (
        "import plancache.functional as pf\n"
        "from plancache import Client\n"
        "pf.lineer(x, w)\n"
        "pf.linear(x, w, b, activaton='gelu')\n"
        "with Client('h:1') as client:\n"
        "    client.admin.warm_stats()\n"
        "    client.compile(g, tuned=True)\n"
    )
    problems = _check_block(code, "t")
    assert len(problems) == 4, problems


def test_the_readme_spec_is_examples_matmul_fp16() -> None:
    first = next(_blocks(README.read_text(), "python"))
    spec_part = first.split("\nwith Client(", 1)[0].replace("import torch\n", "")  # torch: the GPU half
    scope: dict[str, Any] = {}
    exec(spec_part, scope)  # the spec-building half; compiling needs a server and a GPU (tests/gpu/test_gpu_readme.py)
    example = GraphSpec.from_json((ROOT / "examples" / "matmul_fp16.json").read_text())
    assert scope["g"].spec_hash() == example.spec_hash()
    (json_block,) = list(_blocks((ROOT / "docs" / "spec-format.md").read_text(), "json"))[:1]
    assert GraphSpec.from_json(json_block).spec_hash() == example.spec_hash()


def _error_classes() -> set[str]:
    return {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.PlanCacheError) and value.__module__ == errors.__name__
    }


def test_every_error_class_has_a_row_in_the_readme_table() -> None:
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \| [^|]+ \| [^|]+ \|$", README.read_text(), re.M)}
    missing = _error_classes() - rows
    assert not missing, f"README.md's table of errors lacks {sorted(missing)} (what it means, what to do)"
    assert rows >= {"SpecError", "UntrustedPlan", "PlanCacheError"}


def _variables_in(*folders: str) -> set[str]:
    found = set()
    for folder in folders:
        paths = [ROOT / folder] if (ROOT / folder).is_file() else (ROOT / folder).rglob("*")
        for path in paths:
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".yml") and "_pb2" not in path.name:
                found |= set(re.findall(r"\bPLANCACHE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    return found


def test_every_environment_variable_is_documented() -> None:
    """Every PLANCACHE_* variable the client or the server reads (the settings' ones included)."""
    from plancache_server.settings import options

    read = {f"PLANCACHE_{option.env}" for _, option in options()} | _variables_in("client/src", "server/src")
    assert {"PLANCACHE_NO_WARMUP", "PLANCACHE_SERVER", "PLANCACHE_REDIS_URL"} <= read
    documented = set(re.findall(r"`(PLANCACHE_[A-Z0-9_]+)`", (ROOT / "docs" / "configuration.md").read_text()))
    assert not read - documented, f"docs/configuration.md does not document {sorted(read - documented)}"
    anywhere = read | _variables_in("tests/support", "scripts", "docker-compose.yml")
    assert not documented - anywhere, f"docs/configuration.md documents what nothing reads: {documented - anywhere}"


def _commands(text: str) -> Iterator[str]:
    for block in _blocks(text, "sh"):
        for line in block.replace("\\\n", " ").split("\n"):
            if line.strip() and not line.lstrip().startswith("#"):
                yield line.split("#", 1)[0].strip()
    yield from (m for m in re.findall(r"`((?:make|plancache) [^`]+)`", _prose(text)))


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _cli_commands() -> set[str]:
    from plancache.cli.parser import parser

    (sub,) = [a for a in parser()._actions if a.dest == "command"]
    return set(sub.choices)  # type: ignore[arg-type]


def test_the_commands_given_exist() -> None:
    targets, commands = _make_targets(), _cli_commands()
    missing = set()
    for page in PAGES:
        for line in _commands(page.read_text()):
            words = shlex.split(line, comments=True) if "'" not in line or line.count("'") % 2 == 0 else line.split()
            if len(words) < 2 or words[1].startswith("-") or re.match(r"^[A-Z_]+=", words[1]):
                continue
            if (words[0] == "make" and words[1] not in targets) or (
                words[0] == "plancache" and words[1] not in commands
            ):
                missing.add(f"{words[0]} {words[1]}")
    assert not missing, f"the docs give commands that do not exist: {sorted(missing)}"


def test_ci_runs_the_readmes_test_command() -> None:
    readme = README.read_text()
    assert "make run " in readme and "make test " in readme
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_the_license_is_the_apache_2_text_the_packages_declare() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    for package in ("client", "server"):
        assert 'license = "Apache-2.0"' in (ROOT / package / "pyproject.toml").read_text()
