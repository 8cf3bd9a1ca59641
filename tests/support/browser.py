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
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--disable-dev-shm-usage",
)


def chromium_binary() -> str:
    """The Chromium to drive (PLANCACHE_TEST_CHROMIUM, else the first on PATH);
    a test that needs it fails, never skips, when there is none."""
    for name in (os.environ.get("PLANCACHE_TEST_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    raise RuntimeError(
        "no headless Chromium found: `make setup-test` "
        "(scripts/install-os-package.sh chromium) installs Debian's chromium"
    )


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at (screenshots)."""
    path = Path(os.environ.get("PLANCACHE_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chromium(*args: str, timeout: float = 90) -> str:
    with tempfile.TemporaryDirectory(prefix="plancache-chromium-") as profile:
        result = subprocess.run(
            [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
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


# What the layout tests measure in a page, as Chromium lays it out: the page's
# width, and each table's against the room its section gives it (run in the
# host page, on the framed page's document).
_MEASURE = """
const frame = document.getElementById('page');
frame.addEventListener('load', () => {
  const w = frame.contentWindow, d = frame.contentDocument;
  const px = (v) => parseFloat(v) || 0;
  const out = {
    viewport: w.innerWidth, page_width: d.documentElement.scrollWidth, sections: [], tables: [], smallest_font: 1e9,
  };
  for (const s of d.querySelectorAll('section')) {
    const r = s.getBoundingClientRect();
    out.sections.push({id: s.id, left: r.left, right: r.right});
  }
  for (const t of d.querySelectorAll('table')) {
    const s = t.closest('section'), cs = w.getComputedStyle(s);
    const first = t.querySelector('tbody td, tbody th');
    out.tables.push({section: s.id, width: t.scrollWidth,
                     room: s.clientWidth - px(cs.paddingLeft) - px(cs.paddingRight),
                     overflow: cs.overflowX, first_column: first ? w.getComputedStyle(first).position : '',
                     columns: t.querySelectorAll('thead th').length});
  }
  for (const e of d.querySelectorAll('td, th, p, h2')) {
    out.smallest_font = Math.min(out.smallest_font, px(w.getComputedStyle(e).fontSize));
  }
  document.getElementById('layout').textContent = JSON.stringify(out);
});
"""


def _framed(html: str, width: int, height: int, measure: bool) -> str:
    """A host page framing `html` at `width` CSS pixels: headless Chromium's
    window is at least 500 px wide, a frame is exactly as wide as it is told."""
    import html as html_lib

    script = f"<script>{_MEASURE}</script>" if measure else ""
    return (
        '<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">'
        f'<iframe id="page" style="border:0;display:block" width="{width}" height="{height}" '
        f'srcdoc="{html_lib.escape(html, quote=True)}"></iframe>'
        f'<pre id="layout"></pre>{script}</body></html>'
    )


def layout(html: str, width: int, height: int = 2000) -> dict[str, object]:
    """How Chromium lays out `html` in a window `width` CSS pixels wide (see _MEASURE)."""
    import json
    import re

    with tempfile.TemporaryDirectory(prefix="plancache-layout-") as folder:
        host = Path(folder) / "host.html"
        host.write_text(_framed(html, width, height, measure=True))
        dom = _chromium(
            f"--window-size={max(width, 500)},{height}", "--virtual-time-budget=10000", "--dump-dom", host.as_uri()
        )
    found = re.search(r'<pre id="layout">([^<]*)</pre>', dom)
    if not found or not found.group(1):
        raise RuntimeError("the layout script did not run")
    import html as html_lib

    measured: dict[str, object] = json.loads(html_lib.unescape(found.group(1)))
    return measured


def screenshot_html(html: str, path: Path, width: int, height: int = 2400) -> Path:
    """A screenshot of `html` laid out `width` CSS pixels wide, cropped to that width."""
    from matplotlib import image

    with tempfile.TemporaryDirectory(prefix="plancache-shot-") as folder:
        host = Path(folder) / "host.html"
        host.write_text(_framed(html, width, height, measure=False))
        raw = Path(folder) / "raw.png"
        _chromium(f"--window-size={max(width, 500)},{height}", f"--screenshot={raw}", host.as_uri())
        pixels = image.imread(str(raw))
    image.imsave(str(path), pixels[:, :width])
    return path
