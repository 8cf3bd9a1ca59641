"""A call's arguments of the wrong type, refused as InvalidRequest naming the type given, the types the call
takes and, where one exists, the constructor that makes the right one from what was given (a dict, JSON text,
a file, a frontend graph): not an AttributeError from deep inside validation."""

from __future__ import annotations

from pathlib import Path

from plancache.errors import InvalidRequest
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target


def _named(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ in ("builtins", "pathlib") else f"{kind.__module__}.{kind.__qualname__}"


def _spec_hint(value: object) -> str:
    """How to make a GraphSpec from `value`, when there is a way."""
    if isinstance(value, dict):
        return ": a spec's JSON form as a dict is GraphSpec.from_dict(d)"
    if isinstance(value, str | bytes):
        return (
            ": a spec's JSON text is GraphSpec.from_json(text), a spec file GraphSpec.from_json(Path(file).read_text())"
            "; a plan key is fetched with get(key)"
        )
    if isinstance(value, Path):
        return ": a spec file is GraphSpec.from_json(path.read_text())"
    kind = type(value)
    if kind.__module__.split(".")[0] == "cudnn":
        return ": a cuDNN frontend graph is GraphSpec.from_pygraph(graph)"
    if kind.__name__ == "GraphSpec" and kind.__module__.startswith("plancache.v1"):
        return ": a GraphSpec message is plancache.graphspec.spec_io.from_proto(msg)"
    return ""


def check_spec(value: object, call: str, *, query: type | None = None) -> None:
    """Refuse a spec that is no GraphSpec (nor a `query`, plancache.keys.query.PlanQuery, where the call takes
    one) with the way to make one."""
    if isinstance(value, GraphSpec) or (query is not None and isinstance(value, query)):
        return
    accepted = "a GraphSpec or a PlanQuery" if query is not None else "a GraphSpec"
    raise InvalidRequest(f"{call} takes {accepted}, not {_named(value)}{_spec_hint(value)}")


def check_options(value: object, call: str) -> None:
    if value is not None and not isinstance(value, CompileOptions):
        hint = ": make them with CompileOptions(**d)" if isinstance(value, dict) else ""
        raise InvalidRequest(f"{call}: options must be a CompileOptions or None, not {_named(value)}{hint}")


def check_target(value: object, call: str) -> None:
    if value is not None and not isinstance(value, Target | str):
        raise InvalidRequest(
            f"{call}: target must be a Target, a target id (str) or None (this machine's GPU 0), not {_named(value)}"
        )


def check_text(value: object, call: str, what: str, hint: str = "") -> str:
    """A key, hash or id given as text; anything else refused (`hint`: what the caller may have meant)."""
    if isinstance(value, str):
        return value
    raise InvalidRequest(f"{call}: {what} must be a str, not {_named(value)}{hint}")
