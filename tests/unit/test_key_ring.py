"""A signing key's rotation files (plancache.trust.key_ring) with real key
files: stage, promote, endorsements, and what a gateway serves from them
(plancache_server.gateway.signing_keys)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from plancache.errors import InvalidRequest
from plancache.trust.key_ring import CURRENT, NEXT, PREVIOUS, KeyRing
from plancache.trust.pins import ServedKey
from plancache.trust.public_keys import endorses, load_public_key
from plancache.trust.signing import Signer, generate_keypair
from plancache.v1 import plancache_pb2 as pb
from plancache_server.gateway.signing_keys import SigningKeys, clients_address, to_proto


def test_stage_then_promote_keeps_every_key_served(tmp_path: Path) -> None:
    private, _ = generate_keypair(tmp_path / "keys")
    ring = KeyRing(private)
    first = Signer.from_file(private).key_id
    assert [(k.key_id, k.state) for k in ring.read()] == [(first, CURRENT)]
    staged = ring.stage()
    assert staged.state == NEXT and staged.path == tmp_path / "keys" / "plan-signing.next.pem"
    assert stat.S_IMODE(staged.path.stat().st_mode) == 0o600
    assert [(k.key_id, k.state) for k in ring.read()] == [(first, CURRENT), (staged.key_id, NEXT)]
    assert Signer.from_file(private).key_id == first  # the workers still sign with the current key
    with pytest.raises(InvalidRequest, match=f"key {staged.key_id} is staged already"):
        ring.stage()
    created = private.stat().st_mtime
    current, previous = ring.promote()
    assert (current.key_id, previous.key_id) == (staged.key_id, first)
    assert Signer.from_file(private).key_id == staged.key_id
    assert load_public_key(tmp_path / "keys" / "plan-signing.pub.pem") == load_public_key(current.public_pem)
    assert previous.path == tmp_path / "keys" / "plan-signing.previous" / f"{first}.pub.pem"
    assert previous.created_at == created  # its created time, not its retirement's
    assert not (tmp_path / "keys" / "plan-signing.next.pem").exists()
    assert [(k.key_id, k.state) for k in ring.read()] == [(staged.key_id, CURRENT), (first, PREVIOUS)]
    with pytest.raises(InvalidRequest, match="no key is staged"):
        ring.promote()
    # A second rotation: both retired keys stay served, newest first.
    second = ring.stage()
    ring.promote()
    assert [(k.key_id, k.state) for k in ring.read()] == [
        (second.key_id, CURRENT),
        (staged.key_id, PREVIOUS),
        (first, PREVIOUS),
    ]


def test_each_key_is_endorsed_by_the_key_it_follows(tmp_path: Path) -> None:
    private, _ = generate_keypair(tmp_path / "keys")
    ring = KeyRing(private)
    first = ring.read()[0]
    assert first.endorsed_by == "" and first.endorsement == b""  # the first key follows none
    staged = ring.stage()
    assert staged.endorsed_by == first.key_id
    assert endorses(load_public_key(first.public_pem), staged.fingerprint, staged.endorsement)
    assert not endorses(load_public_key(first.public_pem), first.fingerprint, staged.endorsement)
    ring.promote()
    third = ring.stage()
    by_id = {k.key_id: k for k in ring.read()}
    assert by_id[staged.key_id].endorsed_by == first.key_id  # kept through the promotion
    assert third.endorsed_by == staged.key_id
    ring.promote()
    assert {k.key_id: k.endorsed_by for k in ring.read()} == {
        third.key_id: staged.key_id,
        staged.key_id: first.key_id,
        first.key_id: "",
    }


def test_there_is_no_rotation_without_a_current_key(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"no signing key at .* to rotate from"):
        KeyRing(tmp_path / "keys" / "plan-signing.pem").stage()


def test_a_damaged_key_file_is_named(tmp_path: Path) -> None:
    private, _ = generate_keypair(tmp_path / "keys")
    ring = KeyRing(private)
    ring.stage()
    ring.promote()
    [retired] = (tmp_path / "keys" / "plan-signing.previous").glob("*.pub.pem")
    retired.write_text("not a key")
    with pytest.raises(InvalidRequest, match=f"the previous signing key {retired}"):
        ring.read()


def test_a_gateway_serves_its_ring_then_the_keys_it_was_told_of(tmp_path: Path) -> None:
    private, _ = generate_keypair(tmp_path / "own")
    _, remote_public = generate_keypair(tmp_path / "remote")
    KeyRing(private).stage()
    keys = SigningKeys(private, (remote_public, tmp_path / "own" / "plan-signing.pub.pem")).read()
    assert [k.state for k in keys] == [CURRENT, NEXT, CURRENT]  # its own key once, though listed too
    assert keys[2].key_id == Signer.from_file(tmp_path / "remote" / "plan-signing.pem").key_id
    answer = to_proto(keys[1])
    assert answer.state == pb.SIGNING_KEY_STATE_NEXT and answer.endorsed_by == keys[0].key_id
    assert ServedKey.from_proto(answer).endorsed_by_one_of({keys[0].key_id: load_public_key(keys[0].public_pem)})
    assert SigningKeys(None).read() == []


def test_a_caller_asking_in_a_loop_costs_no_key_reads_and_a_staged_key_is_served_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    private, _ = generate_keypair(tmp_path / "own")
    keys = SigningKeys(private)
    reads: list[int] = []
    real_read = keys.read
    monkeypatch.setattr(keys, "read", lambda: reads.append(1) or real_read())

    async def ask(times: int) -> list[int]:
        return [len((await keys.response()).keys) for _ in range(times)]

    assert asyncio.run(ask(50)) == [1] * 50 and len(reads) == 1
    KeyRing(private).stage()
    assert asyncio.run(ask(3)) == [2, 2, 2] and len(reads) == 2  # the staged key at the next ask, read once


@pytest.mark.parametrize(
    ("listen", "port", "shown"),
    [
        ("127.0.0.1:50051", 50051, "127.0.0.1:50051"),
        ("0.0.0.0:0", 41234, "HOST:41234"),
        ("[::]:50051", 50051, "HOST:50051"),
    ],
)
def test_the_logged_command_names_an_address_clients_can_use(listen: str, port: int, shown: str) -> None:
    assert clients_address(listen, port) == shown
