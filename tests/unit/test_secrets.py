"""Secrets on disk (plancache_server.secrets) and the generated signing key's mode."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from plancache.errors import InvalidRequest
from plancache.trust.signing import generate_keypair
from plancache_server.secrets import check_secret, check_secrets
from plancache_server.settings import Settings


def _secret(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_text("x")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_file_passes(tmp_path: Path, mode: int) -> None:
    check_secret("tokens file", _secret(tmp_path, mode), allow_readable=False)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620])
def test_a_file_open_to_group_or_others_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = _secret(tmp_path, mode)
    with pytest.raises(
        InvalidRequest,
        match=rf"the TLS private key {path} can be read by group or others \(mode {mode:04o}\): run `chmod 600 {path}`",
    ):
        check_secret("TLS private key", path, allow_readable=False)


def test_allowed_it_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_secret("plan-signing key", _secret(tmp_path, 0o644), allow_readable=True)
    assert "starting anyway (--allow-readable-secrets)" in caplog.text


def test_a_missing_secret_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"cannot read the tokens file .*missing"):
        check_secret("tokens file", tmp_path / "missing", allow_readable=False)


def test_every_secret_of_the_settings_is_checked(tmp_path: Path) -> None:
    private = _secret(tmp_path, 0o600)
    loose = tmp_path / "loose.pem"
    loose.write_text("x")
    loose.chmod(0o644)
    check_secrets(Settings(tokens_file=private, signing_key=private, tls_key=private))
    for field in ("tokens_file", "signing_key", "tls_key"):
        with pytest.raises(InvalidRequest, match=r"loose\.pem"):
            check_secrets(Settings(**{field: loose}))  # type: ignore[arg-type]


def test_the_generated_signing_key_is_0600_whatever_the_umask_or_an_older_file(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        stale = tmp_path / "plan-signing.pem"
        stale.write_text("old")
        stale.chmod(0o666)
        private, public = generate_keypair(tmp_path)
    finally:
        os.umask(old)
    assert private == stale and private.stat().st_mode & 0o777 == 0o600
    assert "PRIVATE KEY" in private.read_text() and "PUBLIC KEY" in public.read_text()
    assert not list(tmp_path.glob(".*partial"))
