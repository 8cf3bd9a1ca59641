"""Every boolean environment variable, client and server, takes 1/0, true/false, yes/no, on/off in any case;
unset or empty keeps its default; any other word is refused naming the variable and its value (it was read
as off: PLANCACHE_UNSIGNED=true left plans signed, PLANCACHE_ALLOW_UNSIGNED=true refused unsigned ones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from plancache import Client, InvalidRequest
from plancache.env import env_bool, parse_bool
from plancache.gpu.stack import load_math_libraries
from plancache.transport import outcomes
from plancache.trust.signing import TrustPolicy
from plancache_server.settings import server_settings
from plancache_server.settings.command_line import options
from plancache_server.settings.declare import SERVER

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("word", "value"), [*((w, True) for w in ("1", "true", "TRUE", "Yes", "on", " on "))])
def test_the_words_for_on(word: str, value: bool) -> None:
    assert parse_bool(word, "X") is value


@pytest.mark.parametrize("word", ["0", "false", "False", "NO", "off"])
def test_the_words_for_off(word: str) -> None:
    assert parse_bool(word, "X") is False


@pytest.mark.parametrize("word", ["2", "y", "enabled", "truee", "-1"])
def test_any_other_word_is_refused_naming_the_variable_and_its_value(word: str) -> None:
    with pytest.raises(
        InvalidRequest, match=rf"PLANCACHE_X='{re.escape(word)}' is not a boolean: write 1/0, true/false"
    ):
        env_bool("PLANCACHE_X", False, {"PLANCACHE_X": word})


def test_unset_or_empty_keeps_the_default() -> None:
    assert env_bool("PLANCACHE_X", True, {}) is True
    assert env_bool("PLANCACHE_X", True, {"PLANCACHE_X": ""}) is True
    assert env_bool("PLANCACHE_X", False, {"PLANCACHE_X": "  "}) is False


# ---- the client's variables --------------------------------------------------------------


def test_allow_unsigned_takes_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANCACHE_ALLOW_UNSIGNED", "true")
    assert TrustPolicy.create().allow_unsigned is True
    monkeypatch.setenv("PLANCACHE_ALLOW_UNSIGNED", "off")
    assert TrustPolicy.create().allow_unsigned is False
    monkeypatch.setenv("PLANCACHE_ALLOW_UNSIGNED", "sure")
    with pytest.raises(InvalidRequest, match="PLANCACHE_ALLOW_UNSIGNED='sure' is not a boolean"):
        TrustPolicy.create()


def test_hedge_and_report_take_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANCACHE_HEDGE", "no")
    monkeypatch.setenv("PLANCACHE_REPORT", "False")
    with Client("127.0.0.1:1", cache=False) as client:
        assert client.hedge is False and not client._reports.enabled
    monkeypatch.setenv("PLANCACHE_HEDGE", "maybe")
    with pytest.raises(InvalidRequest, match="PLANCACHE_HEDGE='maybe' is not a boolean"):
        Client("127.0.0.1:1", cache=False)
    monkeypatch.setenv("PLANCACHE_HEDGE", "1")
    monkeypatch.setenv("PLANCACHE_REPORT", "nope")
    with pytest.raises(InvalidRequest, match="PLANCACHE_REPORT='nope' is not a boolean"):
        Client("127.0.0.1:1", cache=False)


def test_report_specs_takes_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANCACHE_REPORT_SPECS", "yes")
    outcomes.reports_specs.cache_clear()
    try:
        assert outcomes.reports_specs() is True
    finally:
        outcomes.reports_specs.cache_clear()


def test_no_warmup_takes_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANCACHE_NO_WARMUP", "true")
    load_math_libraries(0)  # returns before it needs torch or a GPU (neither is here)
    monkeypatch.setenv("PLANCACHE_NO_WARMUP", "yes please")
    with pytest.raises(InvalidRequest, match="PLANCACHE_NO_WARMUP='yes please'"):
        load_math_libraries(0)


# ---- the server's switches ---------------------------------------------------------------

SWITCHES = [(name, option) for name, option in options(SERVER) if option.is_switch]


def test_the_server_has_switches() -> None:
    assert {name for name, _ in SWITCHES} >= {"unsigned", "no_warm", "repair_store"}


@pytest.mark.parametrize(("name", "env"), [(name, option.env) for name, option in SWITCHES])
def test_every_server_switch_takes_the_words(monkeypatch: pytest.MonkeyPatch, name: str, env: str) -> None:
    for word, value in (("true", True), ("YES", True), ("on", True), ("false", False), ("0", False)):
        monkeypatch.setenv(f"PLANCACHE_{env}", word)
        assert getattr(server_settings([]), name) is value, word


def test_a_server_switch_with_another_word_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLANCACHE_UNSIGNED", "maybe")
    with pytest.raises(SystemExit):
        server_settings([])
    assert "PLANCACHE_UNSIGNED='maybe' is not a boolean: write 1/0, true/false, yes/no or on/off" in (
        capsys.readouterr().err
    )


def test_no_boolean_variable_is_read_another_way() -> None:
    """No `os.environ.get(...) == "1"` nor a list of off-words of its own: plancache.env reads them all."""
    pattern = re.compile(r"environ.*(==|!=|\bin\b)\s*[(\[]?\s*\"(1|0|true|false|yes|no|on|off)\"", re.IGNORECASE)
    offenders = [
        f"{path.relative_to(REPO)}:{i}"
        for root in ("client/src", "server/src")
        for path in (REPO / root).rglob("*.py")
        if "_pb2" not in path.name
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders
