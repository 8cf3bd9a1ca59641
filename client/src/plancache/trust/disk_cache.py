"""The client's disk cache: plans a node already holds cost no network call.

One file per plan (the Plan proto: metadata + blob), named by the sha256 of
its key, written to a temporary file and renamed into place (a reader never
sees half a plan), size-bounded (least recently used out first), and every
read verified: a file whose blob does not match its sha256, or that does not
parse, is deleted and reads as a miss, so the plan is fetched again.

A write is not fsynced: what a crash can leave (an empty or torn file after
a power loss) is what every read already checks for, and costs one fetch.
A put is on the path of a plan to its caller (a prefetch stream writes each
plan before the program may take it), and an fsync a plan was most of the
stream thread's time per plan at a node's start (GPU run 34's profile). The
bound is kept from a running size: the folder is listed when the size may
be past it, and every RESCAN_PUTS puts (other processes share the folder),
not at every put (a listing of every file, at every plan, grew with the
cache).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

from google.protobuf.message import DecodeError

from plancache.errors import IntegrityError
from plancache.log_limits import LogLimiter
from plancache.run.plan import Plan
from plancache.v1 import plancache_pb2 as pb

log = logging.getLogger(__name__)
# A cache folder that cannot be written (a read-only or full file system) is
# met by every plan: said once a minute, not once per plan.
_faults = LogLimiter(log)

DEFAULT_MAX_BYTES = 2 * 2**30
# Puts between two listings of the folder while the running size says it is within its bound (module doc).
RESCAN_PUTS = 256


def default_cache_dir() -> Path:
    """$PLANCACHE_CACHE_DIR, else $XDG_CACHE_HOME/plancache, else ~/.cache/plancache."""
    explicit = os.environ.get("PLANCACHE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plancache"


class DiskCache:
    def __init__(self, root: Path | str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        # The plans' folder as a string: a lookup is on every miss's path (issue 41), and joining strings and
        # opening the file costs a fraction of pathlib's three joins and read_bytes().
        self._plans = os.path.join(self.root, "plans")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes: int | None = None  # the folder's plans' size as last listed, plus this cache's puts since
        self._puts_since_listed = 0

    def _path(self, plan_key: str) -> Path:
        return Path(self._file(plan_key))

    def _file(self, plan_key: str) -> str:
        digest = hashlib.sha256(plan_key.encode()).hexdigest()
        return f"{self._plans}/{digest[:2]}/{digest}.plan"

    def get(self, plan_key: str) -> Plan | None:
        file = self._file(plan_key)
        try:
            with open(file, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            _faults.warning("read", "disk cache: cannot read %s (%s); fetching plans instead", file, e)
            return None
        path = Path(file)
        try:
            msg = pb.Plan.FromString(data)
            if msg.metadata.key != plan_key:
                raise IntegrityError(f"holds plan {msg.metadata.key!r}")
            plan = Plan.from_proto(msg, source="cache")
        except (DecodeError, IntegrityError) as e:
            log.warning("disk cache: %s is corrupt (%s); discarding it", path, e)
            self._remove(path)
            return None
        try:
            os.utime(path)  # recency for the LRU bound
        except OSError:
            pass
        return plan

    def put(self, plan: Plan) -> None:
        path = self._path(plan.key)
        data = plan.to_bytes()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)  # not fsynced: module doc
                os.replace(tmp, path)
            except BaseException:
                self._remove(Path(tmp))
                raise
        except OSError as e:
            _faults.warning(
                "write", "disk cache: cannot write under %s (%s); plans are served without keeping them", self.root, e
            )
            return
        self._enforce_bound(len(data))

    def delete(self, plan_key: str) -> None:
        self._remove(self._path(plan_key))

    def _enforce_bound(self, added: int) -> None:
        with self._lock:
            self._puts_since_listed += 1
            if self._bytes is not None and self._puts_since_listed < RESCAN_PUTS:
                self._bytes += added
                if self._bytes <= self.max_bytes:
                    return
            self._puts_since_listed = 0
            files = []
            total = 0
            for path in (self.root / "plans").glob("*/*.plan"):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                files.append((stat.st_mtime, stat.st_size, path))
                total += stat.st_size
            if total > self.max_bytes:
                for _, size, path in sorted(files):
                    self._remove(path)
                    total -= size
                    if total <= self.max_bytes * 0.9:
                        break
            self._bytes = total

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
