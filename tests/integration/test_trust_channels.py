"""`plancache trust` on each kind of channel, against an in-process stack
whose worker signs with a key in its ring: TLS pins after printing, a person
at a terminal decides on a plain channel, GetSigningKeys needs a read token."""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plancache import Client
from plancache.cli.entry import main
from plancache.errors import PermissionDenied
from plancache.transport.admin import AdminClient
from plancache.trust.key_ring import KeyRing
from plancache.trust.pins import PinStore
from plancache.trust.signing import Signer, generate_keypair
from plancache_server.store.embedded_redis import EmbeddedRedis
from plancache_server.worker.parts import worker_parts
from tests.conftest import Stack, start_stack
from tests.support.certs import make_pki
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler


@pytest.fixture(autouse=True)
def never_the_real_config_folder() -> None:
    """These tests pin keys: never in the real ~/.config/plancache (tests/conftest.py gives each test its own)."""
    assert os.environ.get("PLANCACHE_CONFIG_DIR"), "PLANCACHE_CONFIG_DIR is not set: refusing to pin keys in ~/.config"


class Terminal(io.StringIO):
    """A person at a terminal who answers the question with `answer`."""

    def isatty(self) -> bool:
        return True


def signed_stack(redis_url: str, tmp_path: Path, **overrides: Any) -> tuple[Stack, Signer, Callable[[], None]]:
    private, _ = generate_keypair(tmp_path / "keys")
    signer = Signer.from_file(private)
    stack, stop = start_stack(redis_url, StandInCompiler(), signer=signer, signing_key=private, **overrides)
    return stack, signer, stop


@pytest.fixture
def plain(redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path) -> Iterator[tuple[Stack, Signer]]:
    stack, signer, stop = signed_stack(redis_server.url, tmp_path)
    yield stack, signer
    stop()


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("n\n", 1), ("\n", 1)])
def test_at_a_terminal_a_person_decides_on_a_plain_channel(
    plain: tuple[Stack, Signer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    code: int,
) -> None:
    stack, signer = plain
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    assert main(["trust", stack.address, "--yes"]) == code  # --yes vouches for nothing on a plain channel
    out = capsys.readouterr()
    assert "came over a plain channel" in out.err and "[y/N]" in out.err
    assert [p.key_id for p in PinStore().pins()] == ([signer.key_id] if code == 0 else [])
    if code == 0:
        with Client(stack.address, cache=False, allow_unsigned=False) as client:
            assert client.compile(matmul_spec(), TARGET).signature.key_id == signer.key_id  # type: ignore[union-attr]


def test_over_tls_the_keys_are_pinned_after_printing(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = make_pki(tmp_path)
    stack, signer, stop = signed_stack(
        redis_server.url, tmp_path, tls_cert=pki["server_cert"], tls_key=pki["server_key"]
    )
    try:
        assert main(["trust", stack.address, "--tls-ca", str(pki["ca"])]) == 0
        out = capsys.readouterr().out
        assert "over TLS" in out and signer.key_id in out and f"pinned {signer.key_id} (current)" in out
        assert [p.key_id for p in PinStore().pins()] == [signer.key_id]
    finally:
        stop()


def test_the_keys_need_a_read_token_and_nothing_more(
    redis_server: EmbeddedRedis, redis_client: object, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("read reader-token-0123456789\ncompile compiler-token-0123456\n")
    stack, signer, stop = signed_stack(redis_server.url, tmp_path, tokens_file=tokens)
    try:
        for token in ("reader-token-0123456789", "compiler-token-0123456"):
            with AdminClient(stack.address, token=token) as admin:
                assert [k.key_id for k in admin.signing_keys()] == [signer.key_id]
        with AdminClient(stack.address, token="reader-token-0123456789") as admin, pytest.raises(PermissionDenied):
            admin.list_plans()  # the read role is what it is: keys, not the admin's calls
    finally:
        stop()


def test_a_worker_counts_a_plan_its_previous_key_signed_as_built(
    plain: tuple[Stack, Signer], redis_client: redis.Redis, tmp_path: Path
) -> None:
    """After a rotation the worker signs with the new key; the plans the old one signed are no damaged
    plans to rebuild (warming would rebuild the whole store)."""
    stack, old = plain
    with Client(stack.address, cache=False) as client:
        plan = client.compile(matmul_spec(), TARGET)
    private = tmp_path / "keys" / "plan-signing.pem"
    ring = KeyRing(private)
    ring.stage()
    ring.promote()
    new = Signer.from_file(private)
    assert new.key_id != old.key_id
    with_ring = worker_parts(redis_client, dataclasses.replace(stack.settings, signing_key=private), new)
    assert with_ring.store.get(plan.key) is not None
    without = worker_parts(redis_client, dataclasses.replace(stack.settings, signing_key=None), new)
    assert without.store.get(plan.key) is None
