"""A private redis-server for a single-host deployment (and for the tests).

With no --redis-url the server starts one of these with its data (AOF) in a
folder of ours, so plans survive a restart. It listens on a unix socket in
that folder (mode 0700) and on no TCP port: nobody but the server's own user
can reach it, so nobody else can write a job or a plan into it. (Tests use
the TCP form on loopback, to kill and restart it on the same port.)

With `tcp_listen` (--redis-listen) it also listens on that TCP address, for
compile workers on other hosts, and then nobody gets in without a password:
the default user's (the server's own, kept in a 0600 config file so that it
is on no command line) and a `plancache-worker` user with only the worker's
ACL rules (plancache_server.store.keys), whose URL is written to
`worker-redis-url` (0600) in the data folder for the operator to hand to the
GPU host. Both passwords are generated once, URL-safe, and kept there.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis

from plancache_server.store import keys
from plancache_server.store.repair import StoreStartError, diagnose, unwritable

log = logging.getLogger(__name__)

# The Redis user a remote worker connects as (`tcp_listen`), with the worker's ACL rules.
WORKER_USER = "plancache-worker"
WORKER_URL_FILE = "worker-redis-url"


def split_host_port(address: str) -> tuple[str, int]:
    """ "0.0.0.0:6379", "[::]:6379" -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def _secret_file(path: Path) -> str:
    """A password generated once (hex: safe in a URL and a config file), kept in `path` (0600)."""
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_hex(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


def _private_file(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


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
        tcp_listen: str | None = None,
    ) -> None:
        """`tcp_listen` ("host:port", with `unix_socket`): also listen there, passwords required (above)."""
        self.data_dir = Path(data_dir)
        self.tcp_listen = split_host_port(tcp_listen) if tcp_listen else None
        if self.tcp_listen and not unix_socket:
            raise ValueError("tcp_listen is for the private store (unix_socket=True)")
        self.binary = binary
        self.unix_socket = unix_socket
        self.port = 0 if unix_socket else port or free_port()
        self.persist = persist
        self.extra_args = (*extra_args, "--requirepass", password) if password else extra_args
        self.password = password
        self._worker_password = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def url(self) -> str:
        if self.unix_socket:
            auth = f":{quote(self.password, safe='')}@" if self.password else ""
            return f"unix://{auth}{self.socket_path}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def shown_url(self) -> str:
        """The URL without its password, for logs."""
        return f"unix://{self.socket_path}?db=0" if self.unix_socket else self.url

    @property
    def worker_url_file(self) -> Path:
        return self.data_dir / WORKER_URL_FILE

    def _open_to_workers(self) -> list[str]:
        """With `tcp_listen`: the arguments that add the TCP address, the default user's password in a config
        file (redis-server's first argument), and the remote workers' password; [] without."""
        if self.tcp_listen is None:
            self.worker_url_file.unlink(missing_ok=True)  # a URL of an earlier start that no longer works
            (self.data_dir / "auth.conf").unlink(missing_ok=True)
            return []
        host, port = self.tcp_listen
        self.password = _secret_file(self.data_dir / "default.password")
        self._worker_password = _secret_file(self.data_dir / "worker.password")
        config = self.data_dir / "auth.conf"
        _private_file(config, f"requirepass {self.password}\n")
        return [str(config), "--port", str(port), "--bind", host]

    def _add_worker_user(self, client: redis.Redis) -> None:
        """The remote workers' user, with the worker's rules only, and its URL for the operator."""
        assert self.tcp_listen is not None
        client.execute_command(  # type: ignore[no-untyped-call]  # the rules as the README gives them, verbatim
            "ACL", "SETUSER", *keys.acl_setuser("worker", WORKER_USER, self._worker_password)
        )
        host, port = self.tcp_listen
        reachable = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
        shown = f"[{reachable}]" if ":" in reachable else reachable
        _private_file(self.worker_url_file, f"redis://{WORKER_USER}:{self._worker_password}@{shown}:{port}/0\n")

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        executable = shutil.which(self.binary)
        if executable is None:
            raise FileNotFoundError(
                f"{self.binary!r} not found: install redis-server (apt-get install redis-server) "
                "or pass --redis-url to use an existing Redis"
            )
        listen = ["--port", str(self.port), "--bind", "127.0.0.1"]
        config: list[str] = []
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self.unix_socket:
                self.data_dir.chmod(0o700)
                listen = ["--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
                opened = self._open_to_workers()
                if opened:
                    config, listen = opened[:1], [*opened[1:], "--unixsocket", str(self.socket_path)]
                    listen += ["--unixsocketperm", "700"]
        except OSError as e:  # a read-only or full file system
            raise unwritable(self.data_dir, f"{type(e).__name__}: {e.strerror or e}") from e
        args = [
            executable,
            *config,
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
            if self.tcp_listen is not None:
                self._add_worker_user(client)
        finally:
            client.close()
        log.info("started private redis-server at %s, data in %s", self.shown_url, self.data_dir)
        if self.tcp_listen is not None:
            host, port = self.tcp_listen
            log.warning(
                "the private redis-server also listens on %s:%d for compile workers on other hosts (a password "
                "required; user %s has the worker's rules only): their PLANCACHE_REDIS_URL is in %s",
                host,
                port,
                WORKER_USER,
                self.worker_url_file,
            )
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

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

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
