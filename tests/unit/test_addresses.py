"""A server address without a port is plancache-server's port (50051), said once; every other form gRPC
takes is kept; a malformed port is InvalidRequest, on the client, the command line and the server's --listen."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from plancache import Client, InvalidRequest, addresses
from plancache.addresses import DEFAULT_PORT, grpc_target
from plancache.cli.entry import main as cli
from plancache_server.settings import Settings, server_settings


@pytest.fixture(autouse=True)
def fresh_warning() -> None:
    addresses._warned.clear()


def test_the_default_port_is_the_servers() -> None:
    assert Settings().listen.endswith(f":{DEFAULT_PORT}")


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("127.0.0.1", "127.0.0.1:50051"),
        ("plancache.internal", "plancache.internal:50051"),
        (" localhost ", "localhost:50051"),
        ("[::1]", "[::1]:50051"),
        ("::1", "[::1]:50051"),
        ("dns:///plancache.internal", "dns:///plancache.internal:50051"),
        ("dns://8.8.8.8/plancache.internal", "dns://8.8.8.8/plancache.internal:50051"),
    ],
)
def test_an_address_without_a_port_takes_50051(given: str, target: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "plancache.addresses"):
        assert grpc_target(given) == target
    assert "has no port: using 50051" in caplog.text


@pytest.mark.parametrize(
    "kept",
    [
        "127.0.0.1:50052",
        "plancache.internal:443",
        "[::1]:7000",
        "[fe80::1%eth0]:7000",
        "dns:///plancache.internal:7000",
        "dns:plancache.internal:7000",
        "unix:/run/plancache.sock",
        "unix:///run/plancache.sock",
        "unix-abstract:plancache",
        "ipv4:10.0.0.1:7000,10.0.0.2:7000",
    ],
)
def test_every_other_form_is_kept(kept: str, caplog: pytest.LogCaptureFixture) -> None:
    assert grpc_target(kept) == kept
    assert not caplog.records


def test_the_warning_is_given_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "plancache.addresses"):
        for host in ("a", "b", "a"):
            grpc_target(host)
    assert len([r for r in caplog.records if "has no port" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("127.0.0.1:abc", "port 'abc' is not a number from 1 to 65535"),
        ("127.0.0.1:", "port '' is not a number"),
        ("127.0.0.1:0", "port '0' is not a number from 1"),
        ("127.0.0.1:70000", "port '70000'"),
        (":50051", "no host in it"),
        ("", "empty server address"),
        ("[::1", "'\\[' without '\\]'"),
        ("[::1]7000", "after '\\]' comes ':port'"),
        ("fe80::1:zz:7000", "a v6 address with a port is written \\[address\\]:port"),
        ("http://host:1", "is a URL; gRPC takes host:port"),
    ],
)
def test_a_malformed_address_is_refused(given: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        grpc_target(given)


def test_a_listen_address_may_ask_for_any_free_port() -> None:
    assert grpc_target("127.0.0.1:0", listening=True) == "127.0.0.1:0"


def test_a_client_dials_the_default_port_not_grpcs_443(monkeypatch: pytest.MonkeyPatch) -> None:
    dialled: list[str] = []
    real = grpc.insecure_channel

    def insecure_channel(target: str, **kwargs: Any) -> grpc.Channel:
        dialled.append(target)
        return real(target, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", insecure_channel)
    Client("127.0.0.1", cache=False, report=False).close()
    assert dialled == ["127.0.0.1:50051"]


def test_a_client_refuses_what_is_no_address() -> None:
    with pytest.raises(InvalidRequest, match="port 'x'"):
        Client("127.0.0.1:x", cache=False)
    with pytest.raises(InvalidRequest, match=r"an address \(str: host:port\) or a grpc\.Channel, not tuple"):
        Client(("127.0.0.1", 50051), cache=False)  # type: ignore[arg-type]


def test_the_command_line_says_a_malformed_address_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["stats", "--server", "127.0.0.1:port"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("plancache: InvalidRequest: server address '127.0.0.1:port': port 'port'")
    assert len(err.strip().splitlines()) == 1


def test_the_servers_listen_address_is_read_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_settings(["--listen", "0.0.0.0"]).listen == "0.0.0.0:50051"
    assert server_settings(["--listen", "[::]:0"]).listen == "[::]:0"
    with pytest.raises(SystemExit):
        server_settings(["--listen", "0.0.0.0:http"])
    assert "argument --listen: server address '0.0.0.0:http': port 'http' is not a number" in capsys.readouterr().err


def test_the_servers_listen_address_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLANCACHE_LISTEN", "0.0.0.0:99999")
    with pytest.raises(SystemExit):
        server_settings([])
    assert "PLANCACHE_LISTEN='0.0.0.0:99999' (the environment's --listen)" in capsys.readouterr().err
