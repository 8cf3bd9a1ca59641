"""Start plancache-server / plancache-worker as real processes (GPU tests and
benchmarks): the same entry points an operator runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from plancache import Client, PlanCacheError
from plancache_server.store.embedded_redis import free_port
from tests.support.hermetic import inherited_environment
from tests.support.ports import free_below_ephemeral

REPO = Path(__file__).resolve().parents[2]


class Proc:
    """A process whose output (stdout and stderr) goes to `log`, read back as it runs."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, env=env or child_env(), stdout=self._file, stderr=subprocess.STDOUT, cwd=REPO
        )

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} not in log:\n{self.text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self._file.close()
        return code


# plancache-server with one worker on "GPU 0" building with the STAND-IN compiler, its plans unsigned.
STANDIN_SERVER_ARGS = ("--gpus", "0", "--compiler", "tests.support.standin:factory", "--unsigned")


def free_port_pair() -> int:
    """A free port whose next port is free too, both below the ephemeral range (tests.support.ports): a server
    given --metrics-port P has its worker serve on P + 1 (a port taken there by another test made the worker exit,
    and its server wait for it, at random; later, with the worker building on, Prometheus never saw it up)."""
    return free_below_ephemeral((0, 1))


def child_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: no PLANCACHE_* variable of the
    caller's shell (tests.support.hermetic), the repo importable (stand-in
    compiler, tests), and `extra`: what the test sets on purpose."""
    base = inherited_environment()
    return {
        **base,
        "PYTHONPATH": os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def signing_public_key(data_dir: Path) -> Path:
    """The public key a server generates in --data-dir for the workers it starts."""
    return data_dir / "keys" / "plan-signing.pub.pem"


def trusting_env(public_key: Path) -> dict[str, str]:
    """Child processes whose clients accept only plans signed with `public_key`."""
    return child_env(PLANCACHE_TRUSTED_KEYS=str(public_key), PLANCACHE_ALLOW_UNSIGNED="0")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextmanager
def server_process(
    address: str, redis_url: str, log: Path, *args: str, env: dict[str, str] | None = None, token: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """plancache-server on `address` against `redis_url`; waits until it answers (with `token`, where the
    server has a tokens file).

    A server holds its data folder exclusively, so one not given --data-dir gets
    its own beside its log: tests running side by side never meet in ~/.local."""
    if "--data-dir" not in args:
        args = (*args, "--data-dir", str(log.with_suffix(".data")))
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plancache_server.main", "--listen", address, "--redis-url", redis_url, *args],
            env=env or child_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            with Client(address, timeout=2, token=token) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.admin.stats()
                        break
                    except PlanCacheError:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"plancache-server did not start:\n{_tail(log)}") from None
                        time.sleep(0.1)
            yield proc
        except Exception as failed:
            # What the server said is the first thing a failing run's reader needs (a CI log has no files).
            failed.add_note(f"the server's log ({log}), its last lines:\n{_tail(log)}")
            raise
        finally:
            _stop(proc)


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


@contextmanager
def worker_process(
    redis_url: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plancache_server.worker_main", "--redis-url", redis_url, *args],
            env=env or child_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            yield proc
        finally:
            _stop(proc)


@contextmanager
def standin_deployment(
    stack: ExitStack,
    redis_url: str,
    logs: Path,
    build_seconds: float,
    *worker_args: str,
    started_dir: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """A plancache-server process and one unsigned stand-in worker process
    (builds of `build_seconds`; `worker_args` more flags; each build marked
    in `started_dir` as it starts), ready: (address, server, worker)."""
    address = f"127.0.0.1:{free_port()}"
    server = stack.enter_context(server_process(address, redis_url, logs / "server.log", "--gpus", "none"))
    env = child_env(
        PLANCACHE_STANDIN_BUILD_SECONDS=str(build_seconds), PLANCACHE_STANDIN_STARTED_DIR=str(started_dir or "")
    )
    worker = stack.enter_context(
        worker_process(
            redis_url,
            logs / "worker.log",
            "--device",
            "0",
            "--compiler",
            "tests.support.standin:factory",
            "--unsigned",
            *worker_args,
            env=env,
        )
    )
    wait_for_workers(address, proc=worker)
    yield address, server, worker


def wait_for_workers(
    address: str, count: int = 1, timeout: float = 180, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Until `count` workers heartbeat on some target."""
    deadline = time.monotonic() + timeout
    with Client(address, timeout=5) as client:
        while True:
            try:
                if any(r.live_workers >= count for r in client.admin.stats()):
                    return
            except PlanCacheError:
                pass
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError("no compile worker came up")
            time.sleep(0.5)
