"""The client's disk cache: plans a node already holds cost no network call.

One file per plan (the Plan proto: metadata + blob), named by the sha256 of
its key, written to a temporary file and renamed into place (a reader never
sees half a plan), size-bounded (least recently used out first), and every
read verified: a file whose blob does not match its sha256, or that does not
parse, is deleted and reads as a miss, so the plan is fetched again.
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
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _path(self, plan_key: str) -> Path:
        digest = hashlib.sha256(plan_key.encode()).hexdigest()
        return self.root / "plans" / digest[:2] / f"{digest}.plan"

    def get(self, plan_key: str) -> Plan | None:
        path = self._path(plan_key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            _faults.warning("read", "disk cache: cannot read %s (%s); fetching plans instead", path, e)
            return None
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
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                self._remove(Path(tmp))
                raise
        except OSError as e:
            _faults.warning(
                "write", "disk cache: cannot write under %s (%s); plans are served without keeping them", self.root, e
            )
            return
        self._enforce_bound()

    def delete(self, plan_key: str) -> None:
        self._remove(self._path(plan_key))

    def _enforce_bound(self) -> None:
        with self._lock:
            files = []
            total = 0
            for path in (self.root / "plans").glob("*/*.plan"):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                files.append((stat.st_mtime, stat.st_size, path))
                total += stat.st_size
            if total <= self.max_bytes:
                return
            for _, size, path in sorted(files):
                self._remove(path)
                total -= size
                if total <= self.max_bytes * 0.9:
                    break

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
