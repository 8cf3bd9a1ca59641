"""Issue 40: a client gets a server's signing keys in one command a user can
audit (`plancache trust HOST:PORT`), after which the README's example works
as written; an unpinned key over a plain channel is refused with the command
to run; the key rotates in two steps without breaking a client.

Real processes: plancache-server with a stand-in compiler worker (its key
generated in --data-dir, as on a GPU host) and the `plancache` CLI; clients
here read the pins the CLI wrote (the test's own config folder, inherited)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import Client, UntrustedPlan
from plancache.transport.admin import AdminClient
from plancache.trust.pins import PinStore, pins_dir
from plancache.trust.signing import Signer
from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from tests.support.processes import REPO, Proc, child_env, wait_for_workers
from tests.support.specs import matmul_bias_relu_spec, matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET

pytestmark = pytest.mark.slow

KEY_LINE = r"signing key ([0-9a-f]{16}) \((current|next|previous)\): fingerprint ([0-9a-f]{64})"


@pytest.fixture(autouse=True)
def never_the_real_config_folder() -> None:
    """These tests pin keys: never in the real ~/.config/plancache (tests/conftest.py gives each test its own)."""
    assert os.environ.get("PLANCACHE_CONFIG_DIR"), "PLANCACHE_CONFIG_DIR is not set: refusing to pin keys in ~/.config"


@pytest.fixture(autouse=True)
def signed_plans_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's client: no trust argument, no environment (the suite's default accepts unsigned plans)."""
    monkeypatch.delenv("PLANCACHE_ALLOW_UNSIGNED")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    redis = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    yield redis.url
    redis.stop()


def start_server(tmp: Path, redis_url: str, port: int, log: str, *extra: str) -> Proc:
    """plancache-server with one stand-in worker on "GPU 0": it signs with the key the server generated."""
    server = Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--listen",
            f"127.0.0.1:{port}",
            "--redis-url",
            redis_url,
            "--data-dir",
            str(tmp / "data"),
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            *extra,
        ],
        tmp / log,
    )
    server.wait_for("listening on", timeout=60)
    return server


def logged_keys(server: Proc) -> dict[str, tuple[str, str]]:
    """key id -> (state, fingerprint), from the server's start-up log."""
    return {kid: (state, fp) for kid, state, fp in re.findall(KEY_LINE, server.text())}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real `plancache` command, with no terminal (stdin is not a TTY)."""
    return subprocess.run(
        [sys.executable, "-m", "plancache.cli", *args],
        env=env or child_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def server_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plancache_server.main", *args],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_one_command_pins_the_servers_key_and_the_readme_example_works(tmp_path: Path, redis_url: str) -> None:
    port, metrics_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    server = start_server(tmp_path, redis_url, port, "server.log", "--metrics-port", str(metrics_port))
    try:
        wait_for_workers(address, proc=server.proc)
        [(kid, (state, fp))] = logged_keys(server).items()
        assert state == "current" and kid == Signer.from_file(tmp_path / "data" / "keys" / "plan-signing.pem").key_id

        # The README's client, before: refused, with the command that fixes it.
        with Client(address) as client, pytest.raises(UntrustedPlan) as refused:
            client.compile(matmul_spec(), TARGET)
        assert f"signed by key {kid}" in refused.value.message
        assert f"run `plancache trust {address}` to fetch and pin the server's keys" in refused.value.message

        # A plain channel, no terminal, no --expect: refused, naming exactly what to run; nothing pinned.
        plain = cli("trust", address)
        assert plain.returncode == 1, plain.stderr
        assert f"plancache trust {address} --expect {fp}\n" in plain.stderr, plain.stderr
        assert fp in plain.stdout and "current" in plain.stdout
        assert PinStore().pins() == []
        wrong = cli("trust", address, "--expect", "ab" * 32)
        assert wrong.returncode == 1 and "someone on the path" in wrong.stderr and PinStore().pins() == []

        # With the fingerprint the server logged: pinned.
        pinned = cli("trust", address, "--expect", fp.upper())
        assert pinned.returncode == 0, pinned.stderr
        assert f"pinned {kid} (current): {pins_dir() / f'{kid}.pem'}" in pinned.stdout
        [pin] = PinStore().pins()
        assert pin.key_id == kid and pin.servers == (address,) and pin.path.stat().st_mode & 0o077 == 0

        # The README's client, after, unchanged.
        with Client(address) as client:
            plan = client.compile(matmul_spec(), TARGET)
        assert plan.signature is not None and plan.signature.key_id == kid

        listed = cli("trust", "--list")
        assert listed.returncode == 0 and kid in listed.stdout and fp in listed.stdout and address in listed.stdout
        again = cli("trust", address)  # nothing new: fine over a plain channel
        assert again.returncode == 0 and "pinned already" in again.stdout, again.stderr

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status.json", timeout=30) as page:
            status = json.load(page)
        assert status["signing_keys"] == [{"key_id": kid, "fingerprint": fp, "state": "current"}]

        removed = cli("trust", "--remove", kid)
        assert removed.returncode == 0 and PinStore().pins() == []
        with Client(address, cache=False) as client, pytest.raises(UntrustedPlan, match="plancache trust"):
            client.get(plan.key)
    finally:
        server.stop()


def test_a_token_channel_pins_after_printing(tmp_path: Path, redis_url: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("read reader-token-0123456789\n")
    tokens.chmod(0o600)
    token_file = tmp_path / "my-token"
    token_file.write_text("reader-token-0123456789\n")
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = start_server(tmp_path, redis_url, port, "server.log", "--tokens-file", str(tokens))
    try:
        [(kid, (_, fp))] = logged_keys(server).items()
        unknown = cli("trust", address)
        assert unknown.returncode == 1 and "Unauthenticated" in unknown.stderr and PinStore().pins() == []
        tokened = cli("trust", address, "--token-file", str(token_file))
        assert tokened.returncode == 0, tokened.stderr
        assert f"pinned {kid} (current)" in tokened.stdout and fp in tokened.stdout
        assert "a token proves this client to the server, not the server to this client" in tokened.stdout
        assert [p.key_id for p in PinStore().pins()] == [kid]
    finally:
        server.stop()


def test_the_key_rotates_without_breaking_a_client(tmp_path: Path, redis_url: str) -> None:
    """Stage (served as next at once) -> `plancache trust` again -> promote and restart: new plans are signed
    by the new key, the old plans stay stored and verify, and no client was refused on the way."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    data = tmp_path / "data"
    server = start_server(tmp_path, redis_url, port, "server.log")
    try:
        wait_for_workers(address, proc=server.proc)
        [(first, (_, first_fp))] = logged_keys(server).items()
        assert cli("trust", address, "--expect", first_fp).returncode == 0
        with Client(address, cache=False) as client:
            old_plan = client.compile(matmul_spec(), TARGET)

        staged = server_command("--stage-signing-key", "--data-dir", str(data))
        assert staged.returncode == 0, staged.stderr
        second, second_fp = re.search(
            r"staged key ([0-9a-f]{16}) \(next\), fingerprint ([0-9a-f]{64})", staged.stdout
        ).groups()  # type: ignore[union-attr]
        with AdminClient(address) as admin:  # served at once, by the running server
            assert [(k.key_id, k.state) for k in admin.signing_keys()] == [(first, "current"), (second, "next")]

        # A client that pinned the current key takes the next one by its endorsement, over the plain channel.
        refreshed = cli("trust", address)
        assert refreshed.returncode == 0, refreshed.stderr
        assert f"pinned {second} (next, endorsed by pinned key {first})" in refreshed.stdout
        # A client new to the server is still asked for both fingerprints.
        stranger = cli("trust", address, env=child_env(PLANCACHE_CONFIG_DIR=str(tmp_path / "stranger")))
        assert stranger.returncode == 1
        assert f"plancache trust {address} --expect {first_fp} --expect {second_fp}\n" in stranger.stderr
    finally:
        server.stop()

    promoted = server_command("--promote-signing-key", "--data-dir", str(data))
    assert promoted.returncode == 0, promoted.stderr
    assert (
        f"current  key {second} (current)" in promoted.stdout and f"previous key {first} (previous)" in promoted.stdout
    )
    server = start_server(tmp_path, redis_url, port, "server-after.log")
    try:
        wait_for_workers(address, proc=server.proc)
        assert {k: s for k, (s, _) in logged_keys(server).items()} == {second: "current", first: "previous"}
        with Client(address, cache=False) as client:
            new_plan = client.compile(matmul_bias_relu_spec(), TARGET)
            kept = client.get(old_plan.key)
            again = client.compile(matmul_spec(), TARGET)
        assert new_plan.signature is not None and new_plan.signature.key_id == second
        assert kept.signature is not None and kept.signature.key_id == first and kept.blob == old_plan.blob
        assert again.source == "hit"  # the old plan still counts as stored: not rebuilt under the new key
        assert "does not trust" not in server.text()
    finally:
        server.stop()
