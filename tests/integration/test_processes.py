"""The real entry points as processes: plancache-server with its private
redis-server, plancache-worker (stand-in compiler), the plancache CLI, and a
restart that keeps the stored plans."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import Client, Plan, TargetUnavailable
from plancache_server.store.embedded_redis import free_port
from tests.support.processes import Proc, child_env
from tests.support.specs import matmul_spec
from tests.support.standin import STANDIN_TARGET

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _server(tmp: Path, port: int, name: str) -> Proc:
    return Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.main",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(tmp / "data"),
            "--gpus",
            "none",
        ],
        tmp / name,
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plancache.cli", *args],
        env=child_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def server_and_worker(tmp_path: Path) -> Iterator[tuple[Proc, Proc, str]]:
    port = free_port()
    server = _server(tmp_path, port, "server.log")
    url = server.wait_for(r"using a private redis-server \(((?:redis|unix)://[^)]+)\)").group(1)
    server.wait_for("listening on")
    keygen = _cli("keygen", "--out", str(tmp_path / "keys"))
    assert keygen.returncode == 0, keygen.stderr
    worker = Proc(
        [
            sys.executable,
            "-m",
            "plancache_server.worker_main",
            "--redis-url",
            url,
            "--device",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--signing-key",
            str(tmp_path / "keys" / "plan-signing.pem"),
        ],
        tmp_path / "worker.log",
    )
    yield server, worker, f"127.0.0.1:{port}"
    worker.stop()
    server.stop()


def _wait_for_worker(client: Client) -> None:
    deadline = time.monotonic() + 30
    while not any(r.live_workers for r in client.admin.stats()):
        assert time.monotonic() < deadline, "worker did not register"
        time.sleep(0.2)


def test_server_worker_cli_and_restart(server_and_worker: tuple[Proc, Proc, str], tmp_path: Path) -> None:
    server, worker, address = server_and_worker
    assert "no GPU on this host: serving stored plans only" in server.text()
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(matmul_spec().to_json())
    public_key = tmp_path / "keys" / "plan-signing.pub.pem"
    with Client(address, trusted_keys=[public_key], allow_unsigned=False) as client:
        _wait_for_worker(client)
        plan = client.compile(matmul_spec(), STANDIN_TARGET)
        assert plan.source == "compiled" and plan.signature is not None  # signed by the worker, verified here

    out = tmp_path / "plan.bin"
    compiled = _cli(
        "compile", str(spec_file), "--server", address, "--target", STANDIN_TARGET.id, "--out", str(out), "--no-cache"
    )
    assert compiled.returncode == 0, compiled.stderr
    assert '"source": "hit"' in compiled.stdout
    from_disk = _cli(
        "compile", str(spec_file), "--server", address, "--target", STANDIN_TARGET.id
    )  # the Client above cached it
    assert '"source": "cache"' in from_disk.stdout, from_disk.stderr
    assert Plan.from_bytes(out.read_bytes()).blob == plan.blob
    fetched = _cli("get", "--key", plan.key, "--server", address)
    assert fetched.returncode == 0 and plan.key in fetched.stdout
    stats = _cli("stats", "--server", address)
    assert stats.returncode == 0 and STANDIN_TARGET.id in stats.stdout
    targets = _cli("targets", "--server", address)
    assert targets.returncode == 0 and STANDIN_TARGET.id in targets.stdout and "1 worker(s)" in targets.stdout

    other = tmp_path / "other.json"
    other.write_text(matmul_spec(m=48).to_json())
    manifest = tmp_path / "manifest.json"
    written = _cli("manifest", str(spec_file), str(other), "--target", STANDIN_TARGET.id, "--out", str(manifest))
    assert written.returncode == 0, written.stderr
    node_cache = tmp_path / "node-cache"
    missing = _cli("prefetch", str(manifest), "--server", address, "--cache-dir", str(node_cache))
    assert (
        missing.returncode == 1 and "1 fetched" in missing.stdout and re.search(r"1\s+other\s+NotFound", missing.stdout)
    ), missing.stdout
    complete = _cli("prefetch", str(manifest), "--server", address, "--cache-dir", str(node_cache), "--compile-missing")
    assert complete.returncode == 0, complete.stdout + complete.stderr
    assert (
        "1 from the disk cache" in complete.stdout
        and "1 compiled" in complete.stdout
        and "2/2 plans" in complete.stderr
    )
    _cli("keygen", "--out", str(tmp_path / "other-keys"))
    untrusted = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli",
            "get",
            "--key",
            plan.key,
            "--server",
            address,
            "--no-cache",
            "--trusted-key",
            str(tmp_path / "other-keys" / "plan-signing.pub.pem"),
        ],
        env=child_env(PLANCACHE_ALLOW_UNSIGNED="0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert untrusted.returncode == 1 and "UntrustedPlan" in untrusted.stderr and "does not trust" in untrusted.stderr
    missing = _cli("get", "--key", plan.key.replace(plan.key[:8], "00000000"), "--server", address)
    assert missing.returncode == 1 and "NotFound" in missing.stderr
    bad = _cli("compile", str(REPO / "README.md"), "--server", address, "--target", STANDIN_TARGET.id)
    assert bad.returncode == 1 and "SpecError: spec is not valid JSON" in bad.stderr

    assert worker.stop() == 0
    assert server.stop() == 0, server.text()
    assert "shutting down" in server.text()

    # Plans survive a restart: the private Redis keeps its data (AOF) in --data-dir.
    port = free_port()
    again = _server(tmp_path, port, "server2.log")
    try:
        again.wait_for("listening on")
        with Client(f"127.0.0.1:{port}", cache=False) as client:
            assert client.get(plan.key).blob == plan.blob
            with pytest.raises(TargetUnavailable, match=re.escape(STANDIN_TARGET.id)):
                client.compile(matmul_spec(m=64), STANDIN_TARGET)
    finally:
        assert again.stop() == 0


def test_worker_needs_a_redis_url(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "plancache_server.worker_main", "--device", "0"],
        env=child_env(PLANCACHE_REDIS_URL=""),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and "needs --redis-url" in proc.stderr


def test_cli_reports_an_unreachable_server() -> None:
    result = _cli("stats", "--server", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert result.returncode == 1 and "Unavailable" in result.stderr


def test_worker_without_the_gpu_stack_exits_without_restart_loop() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache_server.worker_main",
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "--device",
            "0",
            "--compiler",
            "cudnn",
            "--unsigned",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert "install plancache-server[gpu]" in proc.stderr


def test_server_started_workers_sign_with_a_generated_key(tmp_path: Path) -> None:
    """What the GPU tests and benchmarks do, with the stand-in compiler: the
    server generates a key in --data-dir, its workers sign, clients trusting
    only that key verify."""
    from plancache_server.store.embedded_redis import EmbeddedRedis
    from tests.support.processes import server_process, signing_public_key, trusting_env, wait_for_workers

    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    address = f"127.0.0.1:{free_port()}"
    data_dir = tmp_path / "server-data"
    try:
        with server_process(
            address,
            redis_server.url,
            tmp_path / "server.log",
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--data-dir",
            str(data_dir),
        ) as server:
            wait_for_workers(address, proc=server)
            public_key = signing_public_key(data_dir)
            with Client(address, cache=False, trusted_keys=[public_key], allow_unsigned=False) as client:
                plan = client.compile(matmul_spec(), STANDIN_TARGET)
            assert plan.signature is not None
            checked = subprocess.run(
                [sys.executable, "-m", "plancache.cli", "get", "--key", plan.key, "--server", address, "--no-cache"],
                env=trusting_env(public_key),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert checked.returncode == 0, checked.stderr
        assert "generated a plan-signing key" in (tmp_path / "server.log").read_text()
    finally:
        redis_server.stop()


def test_a_server_trusts_what_its_own_workers_sign_whatever_its_environment_says(tmp_path: Path) -> None:
    """Issue 21: a host's shell sets the clients' PLANCACHE_TRUSTED_KEYS, and
    the operator lists another key in --trusted-keys; the server's own
    workers still sign plans it serves, and it says what it did."""
    from plancache.trust.signing import Signer, generate_keypair
    from plancache_server.store.embedded_redis import EmbeddedRedis
    from tests.support.processes import server_process, signing_public_key, wait_for_workers

    stranger_private, stranger_public = generate_keypair(tmp_path / "stranger")
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    address = f"127.0.0.1:{free_port()}"
    data_dir = tmp_path / "server-data"
    log = tmp_path / "server.log"
    env = child_env(PLANCACHE_TRUSTED_KEYS=str(stranger_public))
    try:
        with server_process(
            address,
            redis_server.url,
            log,
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--data-dir",
            str(data_dir),
            "--trusted-keys",
            str(stranger_public),
            env=env,
        ) as server:
            wait_for_workers(address, proc=server)
            with Client(
                address, cache=False, trusted_keys=[signing_public_key(data_dir)], allow_unsigned=False, timeout=20
            ) as client:
                started = time.monotonic()
                plan = client.compile(matmul_spec(), STANDIN_TARGET)
                assert time.monotonic() - started < 10 and plan.source in ("compiled", "provisional")
        text = log.read_text()
        own = Signer.from_file(data_dir / "keys" / "plan-signing.pem").key_id
        assert re.search(
            rf"not among --trusted-keys \({Signer.from_file(stranger_private).key_id}\).*trusted as well", text
        ), text
        assert f"key {own}" in text
        assert "PLANCACHE_TRUSTED_KEYS is the clients' list of trusted keys and is not read by the server" in text
        assert "does not trust" not in text  # no plan read as untrusted
        assert (data_dir / "keys" / "plan-signing.pem").stat().st_mode & 0o777 == 0o600
    finally:
        redis_server.stop()


def _with_tokens(tmp: Path, text: str, mode: int) -> tuple[Path, list[str]]:
    """A tokens file, and the command of a server that reads it."""
    tokens = tmp / "tokens"
    tokens.write_text(text)
    tokens.chmod(mode)
    args = [
        sys.executable,
        "-m",
        "plancache_server.main",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--data-dir",
        str(tmp / "data"),
        "--gpus",
        "none",
        "--tokens-file",
        str(tokens),
    ]
    return tokens, args


def test_a_server_stopped_the_moment_it_listens_exits_at_once(tmp_path: Path) -> None:
    """SIGTERM as soon as "listening on" is logged (a deploy that rolls back
    at once, a test harness): the server used to hang in its shutdown, the
    event subscription having swallowed its cancel."""
    for attempt in range(5):
        (tmp_path / str(attempt)).mkdir()
        server = _server(tmp_path / str(attempt), free_port(), "server.log")
        server.wait_for("listening on")
        started = time.monotonic()
        assert server.stop(timeout=15) == 0, server.text()
        assert time.monotonic() - started < 10, server.text()


def test_secrets_readable_by_others_are_refused_unless_allowed(tmp_path: Path) -> None:
    tokens, args = _with_tokens(tmp_path, "admin " + "a" * 20 + "\n", 0o644)
    refused = Proc(args, tmp_path / "refused.log")
    assert refused.proc.wait(timeout=60) == 1
    assert (
        f"cannot start: the tokens file {tokens} can be read by group or others (mode 0644): run `chmod 600 {tokens}`"
        in refused.text()
    ), refused.text()
    assert "Traceback" not in refused.text()
    allowed = Proc([*args, "--allow-readable-secrets"], tmp_path / "allowed.log")
    try:
        allowed.wait_for("listening on")
        assert (
            "can be read by group or others (mode 0644); starting anyway (--allow-readable-secrets)" in allowed.text()
        )
    finally:
        assert allowed.stop() == 0


def test_a_second_server_on_the_same_data_folder_or_port_is_refused(tmp_path: Path) -> None:
    port = free_port()
    first = _server(tmp_path, port, "first.log")
    try:
        first.wait_for("listening on")
        same_folder = _server(tmp_path, free_port(), "same-folder.log")
        assert same_folder.proc.wait(timeout=60) == 1
        assert re.search(r"data folder .* is in use by plancache-server pid \d+", same_folder.text()), (
            same_folder.text()
        )
        same_port = Proc(
            [
                sys.executable,
                "-m",
                "plancache_server.main",
                "--listen",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(tmp_path / "other"),
                "--gpus",
                "none",
            ],
            tmp_path / "same-port.log",
        )
        assert same_port.proc.wait(timeout=60) == 1
        assert "cannot listen on" in same_port.text(), same_port.text()
        with Client(f"127.0.0.1:{port}", cache=False, timeout=5) as client:
            client.admin.stats()  # the first one still serves
    finally:
        first.stop()


def test_a_short_token_stops_the_server_with_the_line_named_not_a_traceback(tmp_path: Path) -> None:
    tokens, args = _with_tokens(tmp_path, "admin " + "a" * 20 + "\nread short\n", 0o600)
    proc = Proc(args, tmp_path / "server.log")
    assert proc.proc.wait(timeout=60) == 1
    text = proc.text()
    assert f"cannot start: {tokens}:2: expected '<read|compile|admin> <token of 16+ characters>'" in text, text
    assert "Traceback" not in text


def test_a_worker_whose_metrics_port_is_taken_still_builds(tmp_path: Path) -> None:
    """A worker's /metrics port (the server's --metrics-port + 1 + GPU) held by another socket (an outgoing
    connection can hold any ephemeral port): the worker says so and builds; it used to exit and be restarted
    until its supervisor gave up (a CI run lost its status-page tests to it)."""
    import socket

    from plancache_server.store.embedded_redis import EmbeddedRedis
    from tests.support.processes import server_process, wait_for_workers

    # Redis and the server's address first: each takes a free port, which could otherwise be the metrics port
    # probed free below (a full-suite run met "Address already in use" at the server's start once).
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=False).start()
    address = f"127.0.0.1:{free_port()}"
    holder = socket.socket()
    while True:  # a free port whose next one this test holds
        holder.bind(("127.0.0.1", 0))
        metrics_port = holder.getsockname()[1] - 1
        try:
            if str(metrics_port) == address.rsplit(":", 1)[1] or str(metrics_port + 1) == address.rsplit(":", 1)[1]:
                raise OSError("the server's own address")
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", metrics_port))
            break
        except OSError:
            holder.close()
            holder = socket.socket()
    holder.listen()
    try:
        with server_process(
            address,
            redis_server.url,
            tmp_path / "server.log",
            "--gpus",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            "--metrics-port",
            str(metrics_port),
        ) as proc:
            wait_for_workers(address, proc=proc)
            with Client(address, timeout=30) as client:
                assert client.compile(matmul_spec(m=24), STANDIN_TARGET).blob
            assert "serves no /metrics" in (tmp_path / "server.log").read_text()
    finally:
        holder.close()
        redis_server.stop()
