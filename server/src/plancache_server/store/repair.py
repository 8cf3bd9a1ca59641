"""The private store's files, when redis-server will not start on them:
what is wrong, said in one line with the way out (diagnose), and the
repair `plancache-server --repair-store` runs (repair): a backup of the
folder first, then `redis-check-aof --fix`, which cuts the append-only
file at the first damaged command, then the whole commands after the
damage written back (plancache_server/store/aof_salvage.py: what redis-check-aof cuts
includes every later, undamaged write); the plans named in what was
dropped are the plans that may be lost (the server checks which are, once
Redis is up).

Only the private store (no --redis-url) is ours to repair: a shared
Redis belongs to its operator.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from plancache_server.store import keys
from plancache_server.store.aof_salvage import salvage

AOF_FOLDER = "appendonlydir"
CHECK_AOF = "redis-check-aof"
# redis-check-aof asks before it truncates; answering takes well under a second
# for a store of plans (it reads the files once), so this bound is generous.
CHECK_AOF_TIMEOUT_S = 300.0
BACKUPS = "redis-backups"

# What redis-server writes to its log when its files stop it, and what that is.
_DAMAGE_SIGNS = (
    "Bad file format reading the append only file",
    "Unexpected end of file reading the append only file",
    "Unrecoverable error reading the append only file",
    "Short read or OOM loading DB",
    "Wrong RDB checksum",
    "Bad data format",
    "Unknown RDB encoding type",
)
_FOLDER_SIGNS = ("Permission denied", "Read-only file system", "No space left on device", "Disk quota exceeded")
_ANALYZED = re.compile(rb"AOF analyzed: filename=(?P<name>\S+), size=(?P<size>\d+), ok_up_to=(?P<ok>\d+)")


class StoreStartError(RuntimeError):
    """The private redis-server did not start; the message is the one line an operator reads."""

    def __init__(self, message: str, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


def diagnose(data_dir: Path, log_lines: list[str], exit_code: int | None, stderr: str = "") -> StoreStartError:
    """What stopped redis-server, from the lines it logged while starting
    (and its stderr: what it says before its log file is open)."""
    said = next((line.split(" # ", 1)[-1].strip() for line in log_lines if any(s in line for s in _DAMAGE_SIGNS)), None)
    if said is not None:
        return StoreStartError(
            f"the private store in {data_dir} is damaged (redis-server: {said[:300]}): "
            "repair it with `plancache-server --repair-store` (same flags), "
            f"which copies {data_dir} to {backups_of(data_dir)} first, then runs `{CHECK_AOF} --fix` "
            "and reports the plans it could not keep (they are rebuilt on their next request)",
            damaged=True,
        )
    said = next((line.split(" # ", 1)[-1].strip() for line in log_lines if any(s in line for s in _FOLDER_SIGNS)), None)
    if said is not None:
        return unwritable(data_dir, f"redis-server: {said[:300]}")
    last = stderr.strip().replace("\n", " ") or (
        log_lines[-1].split(" # ", 1)[-1].strip() if log_lines else "nothing in its log"
    )
    return StoreStartError(
        f"the private redis-server exited with {exit_code} at start ({last[:300]}; log: {data_dir / 'redis.log'})"
    )


def unwritable(data_dir: Path, said: str) -> StoreStartError:
    return StoreStartError(
        f"the private store's folder {data_dir} cannot be written ({said}): "
        "free space on its disk or make it writable, or give the server another --data-dir; nothing in it was changed"
    )


def backups_of(data_dir: Path) -> Path:
    return data_dir.parent / BACKUPS


@dataclass(frozen=True)
class Repair:
    """What a repair did: where the backup is, which file it cut and by how
    much, the plans named in what it cut (`lost`: those no longer stored,
    filled in once Redis is up)."""

    backup: Path
    cut: list[tuple[str, int, int]]  # (file, its size, bytes kept: before the damage and salvaged after it)
    named: frozenset[str]
    lost: tuple[str, ...] = ()

    def with_lost(self, lost: list[str]) -> Repair:
        return dataclasses.replace(self, lost=tuple(sorted(lost)))

    def summary(self) -> str:
        cut = (
            "; ".join(f"{name}: {size - kept} of {size} bytes dropped" for name, size, kept in self.cut)
            or "nothing cut"
        )
        shown = ", ".join(self.lost[:5]) + (f" and {len(self.lost) - 5} more" if len(self.lost) > 5 else "")
        lost = (
            f"{len(self.lost)} plan(s) lost, listed on the status page until rebuilt: {shown}"
            if self.lost
            else "no plan lost"
        )
        kept = len(self.named) - len(self.lost)
        reverted = f"; {kept} plan(s) named in what was cut are stored (an earlier write of theirs)" if kept else ""
        return f"store repaired ({cut}; backup in {self.backup}): {lost}{reverted}"


def repair(data_dir: Path, check_aof: str = CHECK_AOF) -> Repair:
    """Back the store's folder up, then cut its append-only file at the first
    damaged command. StoreStartError (nothing changed but the backup) when it
    cannot: no AOF, no redis-check-aof, a backup that does not fit, damage
    redis-check-aof cannot cut away (a damaged RDB base)."""
    manifest = next((data_dir / AOF_FOLDER).glob("*.manifest"), None)
    if manifest is None:
        raise StoreStartError(f"no append-only file in {data_dir / AOF_FOLDER}: nothing --repair-store can repair")
    executable = shutil.which(check_aof)
    if executable is None:
        raise StoreStartError(
            f"{check_aof} not found (it comes with redis-server: apt-get install redis-tools); nothing was changed"
        )
    backup = backups_of(data_dir) / time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    try:
        shutil.copytree(data_dir / AOF_FOLDER, backup / AOF_FOLDER)
    except OSError as e:
        shutil.rmtree(backup, ignore_errors=True)
        raise StoreStartError(
            f"could not back {data_dir} up to {backup} ({e}): "
            "nothing was repaired; free space and run --repair-store again"
        ) from e
    try:
        done = subprocess.run(
            [executable, "--fix", str(manifest)],
            input=b"y\n",
            capture_output=True,
            timeout=CHECK_AOF_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise StoreStartError(
            f"{check_aof} --fix {manifest} did not finish within {CHECK_AOF_TIMEOUT_S:.0f} s; backup in {backup}"
        ) from e
    output = done.stdout + done.stderr
    if done.returncode != 0:
        said = next(
            (line for line in output.decode(errors="replace").splitlines() if "not sane" in line or "ERROR" in line), ""
        )
        raise StoreStartError(
            f"{check_aof} --fix could not repair {manifest} "
            f"({said.strip()[:200] or f'exit status {done.returncode}'}): the damage is in its RDB base, "
            f"which cannot be cut away. Backup in {backup}; restore the plans from a bundle (plancache-server-import) "
            f"into an empty store (move {data_dir / AOF_FOLDER} aside), or rebuild them on demand"
        )
    cut, named = [], set()
    for match in _ANALYZED.finditer(output):
        name, size, kept = match["name"].decode(), int(match["size"]), int(match["ok"])
        if kept < size:
            saved = salvage((backup / AOF_FOLDER / name).read_bytes()[kept:])
            if saved.kept:
                with open(
                    data_dir / AOF_FOLDER / name, "ab"
                ) as truncated:  # the later, whole writes back after the cut
                    truncated.write(saved.kept)
            cut.append((name, size, kept + len(saved.kept)))
            named |= keys.plan_keys_named_in(saved.dropped)
    return Repair(backup, cut, frozenset(named))
