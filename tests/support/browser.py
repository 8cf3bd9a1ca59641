"""Headless Chromium (Debian's `chromium` package; `make test` installs it)
for the status page tests: the DOM after rendering, and screenshots.

Flags: no sandbox (CI runs as root), no GPU, and none of Chromium's own
network traffic (the test machines have no internet; without these flags
Chromium keeps trying to reach Google's hosts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import REPO

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
    "--disable-dev-shm-usage",
)  # fmt: skip


def chromium_binary() -> str:
    """The Chromium to drive (PLANCACHE_TEST_CHROMIUM, else the first on PATH);
    a test that needs it fails, never skips, when there is none."""
    for name in (os.environ.get("PLANCACHE_TEST_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    raise RuntimeError("no headless Chromium found: `make setup-test` (scripts/install-os-package.sh chromium) installs Debian's chromium")


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots)."""
    path = Path(os.environ.get("PLANCACHE_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chromium(*args: str, timeout: float = 90) -> str:
    with tempfile.TemporaryDirectory(prefix="plancache-chromium-") as profile:
        result = subprocess.run(
            [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    if result.returncode != 0:
        raise RuntimeError(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def rendered_dom(url: str) -> str:
    """The document as Chromium has it after loading `url`."""
    return _chromium("--dump-dom", url)


def screenshot(url: str, path: Path, width: int = 1440, height: int = 2000) -> Path:
    _chromium(f"--window-size={width},{height}", f"--screenshot={path}", url)
    if not path.exists():
        raise RuntimeError(f"chromium wrote no screenshot to {path}")
    return path
