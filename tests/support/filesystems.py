"""Folders on a file system that is full or read-only, for fault tests.

A real file system, so the processes under test meet the real errors
(ENOSPC, EROFS) from the kernel: a small tmpfs mounted over the folder,
remounted read-only when asked. Mounting needs CAP_SYS_ADMIN (root in the
CI container and on the development machine). Without it, a read-only
folder falls back to permissions (honoured for a user who is not root);
a full one cannot be made, and the test says so by skipping.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@contextmanager
def small_file_system(folder: Path, size_bytes: int) -> Iterator[Path]:
    """`folder` (created empty) on a tmpfs of `size_bytes`; unmounted after."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(folder)):
        pytest.skip(
            "mounting a tmpfs needs CAP_SYS_ADMIN, which this test process lacks: a full disk cannot be made here"
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def remount(folder: Path, read_only: bool) -> None:
    """A folder of small_file_system made read-only, or writable again."""
    if not _mount("-o", f"remount,{'ro' if read_only else 'rw'}", str(folder)):
        raise RuntimeError(f"could not remount {folder} {'read-only' if read_only else 'read-write'}")


@contextmanager
def read_only_folder(folder: Path, size_bytes: int = 16 * 2**20) -> Iterator[Path]:
    """`folder` (created empty, then read-only): a read-only tmpfs where one
    can be mounted, else a folder of mode 0555 (a user other than root)."""
    folder.mkdir(parents=True, exist_ok=True)
    if _mount("-t", "tmpfs", "-o", f"size={size_bytes},ro", "tmpfs", str(folder)):
        try:
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
        return
    if os.geteuid() == 0:
        pytest.skip(
            "root without CAP_SYS_ADMIN: permissions do not stop root, and no read-only file system can be mounted"
        )
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
