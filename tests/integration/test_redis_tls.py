"""Redis over TLS with a password (rediss://): the store and a compile."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from plancache_server.store.embedded_redis import EmbeddedRedis, free_port
from plancache_server.store.redis_conn import connect
from tests.conftest import start_stack
from tests.support.certs import make_pki
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET as TARGET
from tests.support.standin import StandInCompiler

pytestmark = pytest.mark.slow


def test_rediss_url_with_password(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls_port = free_port()
    server = EmbeddedRedis(
        tmp_path / "redis",
        persist=False,
        extra_args=(
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(pki["server_cert"]),
            "--tls-key-file",
            str(pki["server_key"]),
            "--tls-ca-cert-file",
            str(pki["ca"]),
            "--tls-auth-clients",
            "no",
        ),
        password="s3cret",
    )
    try:
        server.start()
    except RuntimeError as e:
        if "tls" in str(e).lower():
            pytest.skip(f"this redis-server was built without TLS: {e}")
        raise
    url = f"rediss://:s3cret@127.0.0.1:{tls_port}/0?ssl_ca_certs={quote(str(pki['ca']))}"
    try:
        client = connect(url)
        assert client.ping()
        with pytest.raises(redis.AuthenticationError):
            connect(f"rediss://:wrong@127.0.0.1:{tls_port}/0?ssl_ca_certs={quote(str(pki['ca']))}").ping()
        stack, stop = start_stack(url, StandInCompiler())
        try:
            with stack.client() as c:
                assert c.compile(matmul_spec(), TARGET).source == "compiled"
                assert c.compile(matmul_spec(), TARGET).source == "hit"
        finally:
            stop()
    finally:
        server.stop()
