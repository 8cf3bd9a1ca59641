"""A call given the wrong type is refused at once as InvalidRequest, naming the type given, what the call
takes and how to make it: never a raw AttributeError from deep inside validation, nor a call sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plancache import AdminClient, Client, CompileOptions, GraphSpec, InvalidRequest, PlanQuery
from plancache.graphspec import spec_io
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET


@pytest.fixture
def client() -> Iterator[Client]:
    # Port 1: nothing listens; every check here must refuse before a call is made.
    with Client("127.0.0.1:1", cache=False, timeout=0.5, hedge=False, report=False) as c:
        yield c


def _spec_dict() -> dict[str, Any]:
    return spec_io.to_dict(matmul_spec())


@pytest.mark.parametrize(
    ("given", "named", "hint"),
    [
        (_spec_dict(), "not dict", r"GraphSpec\.from_dict\(d\)"),
        (json.dumps(_spec_dict()), "not str", r"GraphSpec\.from_json\(text\)"),
        (Path("spec.json"), "not PosixPath", r"GraphSpec\.from_json\(path\.read_text\(\)\)"),
        (spec_io.to_proto(matmul_spec()), "not plancache.v1.plancache_pb2.GraphSpec", r"spec_io\.from_proto\(msg\)"),
        (42, "not int", ""),
    ],
)
def test_compile_names_the_wrong_type_and_how_to_make_a_spec(client: Client, given: Any, named: str, hint: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"compile\(\) takes a GraphSpec or a PlanQuery, {named}.*{hint}"):
        client.compile(given, TARGET)


def test_the_hinted_constructors_exist_and_make_the_same_spec() -> None:
    spec = matmul_spec()
    from_dict, from_json = GraphSpec.from_dict(_spec_dict()), GraphSpec.from_json(json.dumps(_spec_dict()))
    assert from_dict.spec_hash() == from_json.spec_hash() == spec.spec_hash()


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            lambda c: c.race({}, TARGET, None, lambda: None, path="compile"),
            r"race\(\) takes a GraphSpec or a PlanQuery",
        ),
        (lambda c: c.get(spec="{}", target=TARGET), r"get\(spec=\.\.\.\) takes a GraphSpec or a PlanQuery, not str"),
        (lambda c: c.get(matmul_spec()), r"get\(\): the plan key must be a str, not .*GraphSpec: pass a spec as get"),
        (lambda c: c.query({}), r"query\(\) takes a GraphSpec or a PlanQuery, not dict"),
        (lambda c: c.compile(matmul_spec(), 90), r"compile\(\): target must be a Target, a target id \(str\)"),
        (
            lambda c: c.compile(matmul_spec(), TARGET, {"autotune": False}),
            r"compile\(\): options must be a CompileOptions or None, not dict: make them with CompileOptions",
        ),
    ],
)
def test_every_call_of_the_hot_path_checks_its_arguments(
    client: Client, call: Callable[[Client], Any], expected: str
) -> None:
    with pytest.raises(InvalidRequest, match=expected):
        call(client)


def test_a_plan_query_is_checked_where_it_is_made() -> None:
    with pytest.raises(InvalidRequest, match=r"PlanQuery\.of\(\) takes a GraphSpec, not dict: .*from_dict"):
        PlanQuery.of({"nodes": []}, TARGET)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="options must be a CompileOptions"):
        PlanQuery.of(matmul_spec(), TARGET, "autotune")  # type: ignore[arg-type]
    assert PlanQuery.of(matmul_spec(), TARGET, CompileOptions()).key  # the right types still pass


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda a: a.explain({}, TARGET), r"explain\(\) takes a GraphSpec, not dict: .*GraphSpec\.from_dict"),
        (lambda a: a.invalidate(key=b"k"), r"invalidate\(\): key must be a str, not bytes"),
        (lambda a: a.invalidate(spec_hash=matmul_spec()), r"spec_hash must be a str, .*spec\.spec_hash\(\)"),
        (lambda a: a.invalidate(target=90), r"invalidate\(\): target must be a Target"),
        (lambda a: a.drain_worker(7), r"drain_worker\(\): worker_id must be a str, not int"),
        (lambda a: a.family_status(None), r"family_status\(\): family_key must be a str, not NoneType"),
        (lambda a: a.build_family({}, TARGET), r"build_family\(\) takes a Family, not dict: .*Family\.from_dict"),
        (lambda a: a.warm(90, from_target=TARGET), r"warm\(\): target must be a Target"),
    ],
)
def test_the_admin_calls_check_their_arguments(call: Callable[[AdminClient], Any], expected: str) -> None:
    with AdminClient("127.0.0.1:1", timeout=0.5) as admin, pytest.raises(InvalidRequest, match=expected):
        call(admin)
