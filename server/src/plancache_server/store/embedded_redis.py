"""A private redis-server for a single-host deployment (and for the tests).

With no --redis-url the server starts one of these with its data (AOF) in a
folder of ours, so plans survive a restart. It listens on a unix socket in
that folder (mode 0700) and on no TCP port: nobody but the server's own user
can reach it, so nobody else can write a job or a plan into it. (Tests use
the TCP form on loopback, to kill and restart it on the same port.)
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from plancache_server.store.repair import StoreStartError, diagnose, unwritable

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _lines_from(path: Path, offset: int) -> list[str]:
    """The lines a log file gained past `offset` (what this start wrote)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20).decode(errors="replace").splitlines()
    except OSError:
        return []


class EmbeddedRedis:
    def __init__(
        self,
        data_dir: Path,
        binary: str = "redis-server",
        port: int | None = None,
        persist: bool = True,
        extra_args: tuple[str, ...] = (),
        password: str | None = None,
        unix_socket: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = binary
        self.unix_socket = unix_socket
        self.port = 0 if unix_socket else port or free_port()
        self.persist = persist
        self.extra_args = (*extra_args, "--requirepass", password) if password else extra_args
        self.password = password
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{self.socket_path}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        executable = shutil.which(self.binary)
        if executable is None:
            raise FileNotFoundError(
                f"{self.binary!r} not found: install redis-server (apt-get install redis-server) "
                "or pass --redis-url to use an existing Redis"
            )
        listen = ["--port", str(self.port), "--bind", "127.0.0.1"]
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self.unix_socket:
                self.data_dir.chmod(0o700)
                listen = ["--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        except OSError as e:  # a read-only or full file system
            raise unwritable(self.data_dir, f"{type(e).__name__}: {e.strerror or e}") from e
        args = [
            executable,
            *listen,
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--logfile",
            str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]
        log_file = self.data_dir / "redis.log"
        log_start = log_file.stat().st_size if log_file.exists() else 0
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, password=self.password)
        try:
            # Bounded: redis-server answers within timeout_s (of its last "still loading"), or exits saying why.
            while True:
                if self._process.poll() is not None:
                    stderr = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                    raise diagnose(self.data_dir, _lines_from(log_file, log_start), self._process.returncode, stderr)
                try:
                    client.ping()
                    break
                except redis.BusyLoadingError:  # a large store loading: it progresses, so the bound starts again
                    deadline = time.monotonic() + timeout_s
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise StoreStartError(
                        f"the private redis-server did not answer at {self.url} "
                        f"within {timeout_s:.0f} s of its start (log: {log_file})"
                    )
                time.sleep(0.05)
        finally:
            client.close()
        log.info("started private redis-server at %s, data in %s", self.url, self.data_dir)
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """Stop abruptly (fault-injection tests)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
