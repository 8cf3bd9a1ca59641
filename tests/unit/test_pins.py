"""The pinned keys of a client (plancache.trust.pins): where they live, their
modes, damaged or loosened pins refused by name, and which keys a client
trusts when it has pins, explicit keys, or both (TrustPolicy.create)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from plancache.errors import IntegrityError, InvalidRequest, UntrustedPlan
from plancache.trust.pins import PinStore, ServedKey, config_dir, pins_dir
from plancache.trust.public_keys import fingerprint, key_id, load_public_key, normal_fingerprint, public_pem
from plancache.trust.signing import Signer, TrustPolicy, generate_keypair
from plancache.v1 import plancache_pb2 as pb


@pytest.fixture(autouse=True)
def never_the_real_config_folder() -> None:
    """These tests pin keys: never in the real ~/.config/plancache (tests/conftest.py gives each test its own)."""
    assert os.environ.get("PLANCACHE_CONFIG_DIR"), "PLANCACHE_CONFIG_DIR is not set: refusing to pin keys in ~/.config"


def served(private: Ed25519PrivateKey | None = None, state: str = "current") -> ServedKey:
    public = (private or Ed25519PrivateKey.generate()).public_key()
    return ServedKey(key_id(public), fingerprint(public), state, public_pem(public), 1.0e9)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_config_folder_is_the_variable_then_xdg_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PLANCACHE_CONFIG_DIR")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert config_dir() == tmp_path / "home" / ".config" / "plancache"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert pins_dir() == tmp_path / "xdg" / "plancache" / "trusted-keys"
    monkeypatch.setenv("PLANCACHE_CONFIG_DIR", str(tmp_path / "mine"))
    assert pins_dir() == tmp_path / "mine" / "trusted-keys"


def test_the_suite_never_reads_the_real_config_folder() -> None:
    """tests/conftest.py points every test (and the processes it starts) at a folder of its own."""
    assert Path(os.environ["PLANCACHE_CONFIG_DIR"]) != Path.home() / ".config" / "plancache"
    assert not pins_dir().exists()


def test_a_pin_is_a_pem_and_a_record_named_by_key_id_readable_only_by_the_user(tmp_path: Path) -> None:
    os.umask(0o022)
    store = PinStore(tmp_path / "config" / "trusted-keys")
    key = served()
    pin = store.pin(key, "gpu-1.internal:50051")
    assert pin.path == store.directory / f"{key.key_id}.pem"
    assert sorted(p.name for p in store.directory.iterdir()) == [f"{key.key_id}.json", f"{key.key_id}.pem"]
    assert mode(store.directory) == 0o700 and mode(store.directory.parent) == 0o700
    assert all(mode(p) == 0o600 for p in store.directory.iterdir())
    record = json.loads((store.directory / f"{key.key_id}.json").read_text())
    assert record["servers"] == ["gpu-1.internal:50051"] and record["fingerprint"] == key.fingerprint
    # Pinned again from another address of the same server: both recorded, one pin.
    store.pin(key, "10.0.0.7:50051")
    [again] = store.pins()
    assert again.servers == ("gpu-1.internal:50051", "10.0.0.7:50051") and again.public_key == pin.public_key
    assert store.keys().keys() == {key.key_id}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("pem", "not a PEM public key"),
        ("other-key", "holds key"),
        ("record", "does not parse"),
        ("name", "the name is not a key id"),
    ],
)
def test_a_damaged_pin_is_refused_naming_the_file(damage: str, named: str) -> None:
    store = PinStore()  # the default folder (the test's own): what a client reads
    key = served()
    pin = store.pin(key, "a:1")
    if damage == "pem":
        pin.path.write_text("-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")
        culprit = pin.path
    elif damage == "other-key":
        pin.path.write_bytes(served().public_key_pem)
        culprit = pin.path
    elif damage == "record":
        culprit = pin.path.with_suffix(".json")
        culprit.write_text("{not json")
    else:
        culprit = store.directory / "my-key.pem"
        culprit.write_bytes(served().public_key_pem)
        culprit.chmod(0o600)
    with pytest.raises(InvalidRequest, match=named) as refused:
        store.pins()
    assert str(culprit) in refused.value.message and "plancache trust --remove" in refused.value.message
    with pytest.raises(InvalidRequest, match=str(culprit)):  # a client does not start, trusting the rest
        TrustPolicy.create(allow_unsigned=False)
    if damage != "name":
        store.remove(key.key_id)  # a damaged pin can still be removed
        assert store.pins() == []


@pytest.mark.parametrize("loosened", ["folder", "file"])
def test_a_pin_others_could_change_is_refused(tmp_path: Path, loosened: str) -> None:
    store = PinStore(tmp_path / "trusted-keys")
    pin = store.pin(served(), "a:1")
    path = store.directory if loosened == "folder" else pin.path
    path.chmod(0o770 if loosened == "folder" else 0o620)
    with pytest.raises(InvalidRequest, match=rf"{path} can be changed by group or others .*chmod"):
        store.pins()
    if loosened == "folder":
        with pytest.raises(InvalidRequest, match="can be changed by group or others"):
            store.pin(served(), "a:1")  # nor is anything added to it


def test_removing_a_pin_that_is_not_there_says_so(tmp_path: Path) -> None:
    store = PinStore(tmp_path / "trusted-keys")
    with pytest.raises(InvalidRequest, match="no key 0123456789abcdef is pinned"):
        store.remove("0123456789abcdef")
    with pytest.raises(InvalidRequest, match="not a key id"):
        store.remove("../../etc/passwd")


def test_a_server_key_whose_fields_disagree_with_its_pem_is_refused() -> None:
    private = Ed25519PrivateKey.generate()
    good = served(private)
    answer = pb.SigningKey(
        public_key_pem=good.public_key_pem.decode(),
        key_id=good.key_id,
        fingerprint=good.fingerprint,
        state=pb.SIGNING_KEY_STATE_NEXT,
    )
    assert ServedKey.from_proto(answer).state == "next"
    answer.key_id = served().key_id  # a server naming another key than the one it sends
    with pytest.raises(IntegrityError, match="is not the key its PEM holds"):
        ServedKey.from_proto(answer)


def test_fingerprints_are_taken_as_people_paste_them() -> None:
    fp = served().fingerprint
    spaced = ":".join(fp[i : i + 2] for i in range(0, 64, 2)).upper()
    assert normal_fingerprint(fp) == normal_fingerprint(f"SHA256:{spaced}") == fp
    with pytest.raises(InvalidRequest, match="not a key fingerprint"):
        normal_fingerprint(fp[:16])  # a key id is not enough


def _signed_plan(signer: Signer) -> tuple[pb.PlanMetadata, pb.PlanSignature]:
    metadata = pb.PlanMetadata(key="k", blob_sha256="0" * 64)
    return metadata, signer.sign(metadata)


def test_pinned_keys_are_trusted_when_nothing_else_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private, public = generate_keypair(tmp_path / "server")
    signer = Signer.from_file(private)
    metadata, signature = _signed_plan(signer)
    # Nothing pinned: refused, with the command that fixes it and this client's server in it.
    nothing = TrustPolicy.create(allow_unsigned=False, server="gpu-1.internal:50051")
    with pytest.raises(UntrustedPlan) as refused:
        nothing.check(metadata, signature)
    assert f"none pinned in {pins_dir()}" in refused.value.message
    assert "run `plancache trust gpu-1.internal:50051` to fetch and pin the server's keys" in refused.value.message
    assert "HOST:PORT" in _refusal(TrustPolicy.create(allow_unsigned=False), metadata, signature)
    PinStore().pin(ServedKey(signer.key_id, fingerprint(_pub(public)), "current", public.read_bytes(), 0.0), "x:1")
    TrustPolicy.create(allow_unsigned=False).check(metadata, signature)  # the pin is trusted


def test_named_keys_replace_the_pins_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program or a deployment that names its keys restricts itself to them, whatever its user pinned."""
    pinned_private, pinned_public = generate_keypair(tmp_path / "pinned")
    _, other_public = generate_keypair(tmp_path / "other")
    pinned_signer = Signer.from_file(pinned_private)
    PinStore().pin(
        ServedKey(pinned_signer.key_id, fingerprint(_pub(pinned_public)), "current", pinned_public.read_bytes(), 0.0),
        "x:1",
    )
    metadata, signature = _signed_plan(pinned_signer)
    explicit = TrustPolicy.create([other_public], allow_unsigned=False, server="x:1")
    assert explicit.keys.keys() == {key_id(_pub(other_public))}
    message = _refusal(explicit, metadata, signature)
    assert "from trusted_keys, in place of any pinned keys" in message and "leave trusted_keys empty" in message
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(other_public))
    from_env = TrustPolicy.create(allow_unsigned=False)
    assert from_env.keys.keys() == {key_id(_pub(other_public))}
    assert "from PLANCACHE_TRUSTED_KEYS, in place of any pinned keys" in _refusal(from_env, metadata, signature)
    # An argument wins over the environment too, and both over the pins.
    assert TrustPolicy.create([pinned_public], allow_unsigned=False).keys.keys() == {pinned_signer.key_id}
    monkeypatch.delenv("PLANCACHE_TRUSTED_KEYS")
    TrustPolicy.create(allow_unsigned=False).check(metadata, signature)
    # A server's own lists never read a user's pins.
    server_side = TrustPolicy.create(allow_unsigned=False, pinned=False, holder="this gateway")
    assert server_side.keys == {}
    assert "plancache trust" not in _refusal(server_side, metadata, signature)


def _pub(path: Path) -> Ed25519PublicKey:
    return load_public_key(path)


def _refusal(policy: TrustPolicy, metadata: pb.PlanMetadata, signature: pb.PlanSignature) -> str:
    with pytest.raises(UntrustedPlan) as refused:
        policy.check(metadata, signature)
    return refused.value.message
