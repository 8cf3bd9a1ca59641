"""Targets, options, plan keys and Redis key names."""

from __future__ import annotations

import pytest

from plancache import CompileOptions, InvalidRequest, Target
from plancache.keys.plankey import make_key, parse_key
from plancache_server.store import keys

H200 = Target("sm_90", 91900, "1.32.0", "NVIDIA H200", 132)


def test_target_id_round_trip() -> None:
    assert H200.id == "sm_90/cudnn-91900/fe-1.32.0/dev-nvidia-h200/sms-132"
    assert Target.parse(H200.id).id == H200.id
    assert H200.generic().id == "sm_90/cudnn-91900/fe-1.32.0"
    assert Target.parse("sm_90/cudnn-91900/fe-1.32.0") == H200.generic()
    assert Target.from_proto(H200.to_proto()) == H200


@pytest.mark.parametrize(
    "text",
    [
        "sm90/cudnn-91900/fe-1.32.0",
        "sm_90/cudnn-x/fe-1.32.0",
        "sm_90/cudnn-91900",
        "sm_90/cudnn-91900/fe-1.32.0/gpu-x",
        "sm_90/cudnn-91900/fe-1/2",
    ],
)
def test_bad_targets_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        Target.parse(text)


def test_options_normalize_and_identify() -> None:
    assert CompileOptions().id == CompileOptions(heuristic_modes=("a", "fallback")).id
    assert (
        CompileOptions(excluded_behavior_notes=("CUBLASLT_DEPENDENCY", "RUNTIME_COMPILATION")).id
        == CompileOptions(excluded_behavior_notes=("runtime_compilation", "cublaslt_dependency")).id
    )
    ids = {
        CompileOptions().id,
        CompileOptions(autotune=False).id,
        CompileOptions(workspace_limit=1 << 20).id,
        CompileOptions(heuristic_modes=("B",)).id,
        CompileOptions(excluded_behavior_notes=("RUNTIME_COMPILATION",)).id,
    }
    assert len(ids) == 5
    assert CompileOptions.from_proto(CompileOptions(autotune=False).to_proto()) == CompileOptions(autotune=False)
    with pytest.raises(InvalidRequest, match="heuristic mode 'C'"):
        CompileOptions(heuristic_modes=("C",))
    with pytest.raises(InvalidRequest, match="behavior note"):
        CompileOptions(excluded_behavior_notes=("FAST",))


def test_plan_key_composes_and_parses() -> None:
    key = make_key("ab" * 32, H200, CompileOptions())
    parsed = parse_key(key)
    assert parsed.spec_hash == "ab" * 32 and parsed.target.id == H200.id and parsed.options_id == CompileOptions().id
    for bad in ("", "nope", "ab" * 32 + "/sm_90/opt-0", "zz" * 32 + "/" + H200.id + "/" + CompileOptions().id):
        with pytest.raises(InvalidRequest):
            parse_key(bad)


def test_redis_keys_of_one_plan_share_a_hash_tag() -> None:
    key = make_key("ab" * 32, H200, CompileOptions())
    names = [keys.plan(key), keys.build_lease(key), keys.job_state(key)]
    assert len(set(names)) == 3
    assert all(n.split("{", 1)[1].split("}", 1)[0] == key for n in names)


def test_parsed_keys_share_their_target_and_are_kept_within_a_bound() -> None:
    """A worker storing a new plan a second grew ~5 MB an hour (bench/soak.py): every parsed key kept its
    own Target, up to 65,536 keys. Keys of one target now share one, and at most PARSED_KEYS_KEPT are kept."""
    from plancache.keys import plankey

    target = "sm_90/cudnn-91900/fe-1.32.0/dev-nvidia-h200/sms-132"
    keys = [f"{i:064x}/{target}/opt-1061e5152429a446" for i in range(3)]
    parsed = [plankey.parse_key(k) for k in keys]
    assert parsed[0].target is parsed[1].target is parsed[2].target
    assert parsed[0].target.id == target
    assert plankey.parse_key.cache_info().maxsize == plankey.PARSED_KEYS_KEPT <= 8192


def test_an_options_id_is_made_once_per_instance_and_is_its_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query's key and the check of the plan that answers it each read the id: made once (a canonical form and a
    hash), the same for equal options, another for other ones; a query naming no options shares one instance."""
    from plancache.keys import options as options_module
    from plancache.keys.query import DEFAULT_OPTIONS, PlanQuery
    from tests.support.specs import matmul_spec

    made: list[object] = []
    canonicalize = options_module.canonicalize
    monkeypatch.setattr(options_module, "canonicalize", lambda value: made.append(value) or canonicalize(value))
    tuned, heuristic = CompileOptions(), CompileOptions(autotune=False)
    assert tuned.id == tuned.id == CompileOptions().id and heuristic.id == heuristic.id
    assert heuristic.id != tuned.id and len(made) == 3  # once per instance: tuned, the fresh one, heuristic
    target = Target("sm_90", 91900, "1.32.0", "Some GPU", 132)
    assert PlanQuery.of(matmul_spec(), target).options is DEFAULT_OPTIONS is PlanQuery.of(matmul_spec(), target).options
