"""What scripts/frontend_suite.py runs: the frontend's files with the one-line
change made (rewrite_imports), its sample notebooks as scripts
(notebook_to_script; scripts/fetch-frontend-tests.sh converts them), and
the two work copies, native and rewritten (prepare).

Standard library only: the conversion runs where plancache is not installed.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ImportRewriteError(Exception):
    """A file imports cudnn in a way the rewrite does not cover: the comparison would not be fair."""


@dataclass
class Rewrite:
    text: str
    changed: int  # lines rewritten
    kept: list[str] = field(default_factory=list)  # imports of frontend submodules, left as they are (line: text)


_IMPORT = re.compile(
    r"^(?P<indent>\s*)import\s+(?P<module>cudnn(?:\.\w+)*)(?:\s+as\s+(?P<alias>\w+))?\s*(?P<comment>#.*)?$"
)
_FROM = re.compile(r"^(?P<indent>\s*)from\s+cudnn\s+import\b")


def _is_cudnn(module: str | None) -> bool:
    return module is not None and (module == "cudnn" or module.startswith("cudnn."))


def _dynamic_import(node: ast.AST) -> bool:
    """__import__("cudnn") or importlib.import_module("cudnn..."): not rewritten, so refused."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func, arg = node.func, node.args[0]
    named = (isinstance(func, ast.Name) and func.id in ("__import__", "import_module")) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    return named and isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _is_cudnn(arg.value)


def rewrite_imports(source: str, filename: str = "<source>") -> Rewrite:
    """`source` with the name `cudnn` bound to plancache.cudnn wherever it was the frontend:

        import cudnn                  -> import plancache.cudnn as cudnn
        import cudnn as X             -> import plancache.cudnn as X
        from cudnn import A, B as C   -> from plancache.cudnn import A, B as C  (it re-exports the frontend)
        import cudnn.sub              -> import cudnn.sub; import plancache.cudnn as cudnn
                                         (binds `cudnn` too: left alone it would rebind it to the frontend)
        import cudnn.sub as X, from cudnn.sub import Y: kept (a frontend module's own code)

    Only those lines change, one for one (line numbers match the native copy's).
    Any other import of cudnn (several modules on one line, a compound
    statement, __import__/import_module) raises ImportRewriteError."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise ImportRewriteError(f"{filename}: cannot parse: {e}") from e
    lines = source.splitlines(keepends=True)
    changed, kept, refused = 0, list[str](), list[str]()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(_is_cudnn(a.name) for a in node.names):
            line = lines[node.lineno - 1]
            body, newline = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")) :]
            m = _IMPORT.match(body)
            if m is None or len(node.names) != 1 or node.end_lineno != node.lineno:
                refused.append(f"{filename}:{node.lineno}: {body.strip()}")
                continue
            module, alias, comment = m["module"], m["alias"], f"  {m['comment']}" if m["comment"] else ""
            if module == "cudnn":
                new = f"import plancache.cudnn as {alias or 'cudnn'}"
            elif alias:
                kept.append(f"{node.lineno}: {body.strip()}")
                continue
            else:
                new = f"import {module}; import plancache.cudnn as cudnn"
            lines[node.lineno - 1] = f"{m['indent']}{new}{comment}{newline}"
            changed += 1
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_cudnn(node.module):
            line = lines[node.lineno - 1]
            if node.module != "cudnn":
                kept.append(f"{node.lineno}: {line.strip()}")
                continue
            found = _FROM.match(line)
            if found is None:
                refused.append(f"{filename}:{node.lineno}: {line.strip()}")
                continue
            lines[node.lineno - 1] = f"{found['indent']}from plancache.cudnn import{line[found.end() :]}"
            changed += 1
        elif _dynamic_import(node):
            refused.append(f"{filename}:{getattr(node, 'lineno', '?')}: a dynamic import of cudnn")
    if refused:
        raise ImportRewriteError("imports of cudnn the rewrite does not cover:\n  " + "\n  ".join(refused))
    return Rewrite("".join(lines), changed, kept)


# ---- notebooks to scripts ----------------------------------------------------------------

# Cell magics whose body is still Python (the magic line itself becomes `pass`).
_PYTHON_CELL_MAGICS = {"capture", "time", "timeit"}
_IPYTHON_FROM = re.compile(r"^from\s+IPython(?:\.\w+)*\s+import\s+(?P<names>[\w\s,]+?)\s*(#.*)?$")
_PRELUDE = """\
def _notebook_only(*args, **kwargs):  # IPython's display calls: nothing to show outside a notebook
    return None


display = _notebook_only
"""


def _script_line(line: str) -> str:
    stripped = line.lstrip()
    indent = line[: len(line) - len(stripped)]
    if stripped.startswith(("!", "%")) or ("get_ipython(" in stripped and not stripped.startswith("#")):
        return f"{indent}pass  # notebook only: {stripped}"  # `pass`, not nothing: the line may be a block's only one
    found = _IPYTHON_FROM.match(stripped)
    if found:
        bound = [part.split(" as ")[-1].strip() for part in found["names"].split(",") if part.strip()]
        return f"{indent}{' = '.join(bound)} = _notebook_only  # notebook only: {stripped}"
    if re.match(r"import\s+IPython\b", stripped):
        return f"{indent}pass  # notebook only: {stripped}"
    return line


def notebook_to_script(notebook: str, origin: str) -> str:
    """The code cells of a notebook (its JSON text) as one script, in order:
    shell (`!`) and magic (`%`) lines become `pass`, cells of a non-Python cell
    magic (%%bash ...) are commented out, IPython imports and display() are no-ops."""
    cells = json.loads(notebook).get("cells", [])
    out = [
        f"# {origin}: its code cells, converted by scripts/fetch-frontend-tests.sh",
        "# (shell and magic lines made no-ops)",
        "",
        _PRELUDE,
    ]
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        lines = ("".join(source) if isinstance(source, list) else str(source)).splitlines()
        out.append(f"# %% cell {index}")
        first = next((line.strip() for line in lines if line.strip()), "")
        if first.startswith("%%") and first[2:].split(" ")[0] not in _PYTHON_CELL_MAGICS:
            out += [f"# {line}" for line in lines]
        else:
            out += [_script_line(line) for line in lines]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def convert_notebooks(src: Path, dest: Path) -> list[str]:
    """Every src/*.ipynb as dest/<stem>.py; returns warnings (a script that does not compile)."""
    dest.mkdir(parents=True, exist_ok=True)
    warnings = []
    for notebook in sorted(src.glob("*.ipynb")):
        script = notebook_to_script(notebook.read_text(), f"samples/python/{notebook.name}")
        try:
            compile(script, notebook.name, "exec")
        except SyntaxError as e:
            warnings.append(f"{notebook.name}: the converted script does not compile: {e}")
        (dest / f"{notebook.stem}.py").write_text(script)
    return warnings


# ---- the work copies ----------------------------------------------------------------------


@dataclass
class Prepared:
    tests: list[str]  # pytest arguments, relative to test/python
    samples: list[str]  # sample file names
    rewrites: dict[str, dict[str, Any]]  # file -> lines rewritten, imports kept
    unrewritten: dict[str, str]  # unselected test files the rewrite refused (never collected)


def select_tests(suite: Path, tests: list[str]) -> list[str]:
    """`tests` as pytest arguments relative to test/python: file names with or without .py, paths, FILE::TEST."""
    selected = []
    for test in tests:
        file, sep, rest = test.partition("::")
        file = file.removeprefix("./").removeprefix("test/python/")
        file = file if file.endswith(".py") else f"{file}.py"
        if not (suite / "test" / "python" / file).is_file():
            raise SystemExit(f"{file}: not in {suite}/test/python")
        selected.append(file + sep + rest)
    return selected


def select_samples(suite: Path, patterns: list[str] | None) -> list[str]:
    if patterns is None:
        return []
    every = sorted(p.name for p in (suite / "samples").glob("*.py"))
    return [n for n in every if not patterns or any(fnmatch.fnmatch(n, p) or n.startswith(p) for p in patterns)]


def _imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports (nothing when it does not parse)."""
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return set()
    names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    return names | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    }


def prepare(suite: Path, work: Path, tests: list[str], samples: list[str]) -> Prepared:
    """work/native and work/plancache: test/python (the frontend's conftest.py in
    place) and samples/; in work/plancache every cudnn import rewritten."""
    needed = {t.partition("::")[0] for t in tests}
    rewrites: dict[str, dict[str, Any]] = {}
    unrewritten: dict[str, str] = {}
    for phase in ("native", "plancache"):
        root = work / phase
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(
            suite / "test" / "python", root / "test" / "python", ignore=shutil.ignore_patterns("__pycache__")
        )
        (root / "samples").mkdir(parents=True)
        for sample in samples:
            shutil.copy2(suite / "samples" / sample, root / "samples" / sample)
    refused = []
    plancache = work / "plancache"
    files = sorted(plancache.rglob("*.py"))
    imported = set().union(*(_imported_modules(path) for path in files))
    for path in files:
        relative = path.relative_to(plancache).as_posix()
        try:
            rewrite = rewrite_imports(path.read_text(), relative)
        except ImportRewriteError as e:
            # A test file that is neither selected nor imported by any file (as test_utils.py
            # is) never runs: noted. Anything else may run: the comparison would not be fair.
            top_level_test = path.parent == plancache / "test" / "python" and path.name.startswith("test_")
            if top_level_test and path.name not in needed and path.stem not in imported:
                unrewritten[path.name] = str(e)
            else:
                refused.append(str(e))
            continue
        if rewrite.changed or rewrite.kept:
            path.write_text(rewrite.text)
            rewrites[relative] = {"rewritten": rewrite.changed, "kept": rewrite.kept}
    if refused:
        raise ImportRewriteError("\n".join(refused))
    return Prepared(tests, samples, rewrites, unrewritten)
