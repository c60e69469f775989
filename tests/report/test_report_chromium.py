"""The HTML report in a real browser: Debian's headless Chromium loads it from a file,
with no console message (no script error, no blocked fetch), and a screenshot shows the
charts in their colours.

Set ``NETDIAG_SCREENSHOT_DIR`` to keep the screenshots for a look.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pngcheck import colours, read_png
from report_docs import HOSTILE, hostile_doc, with_paths

from netdiag.report.html import render_html

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
PHASE_RGB = {"DNS": (0x0F, 0x8B, 0x7E), "TLS": (0x8E, 0x3B, 0xD8),
             "waiting": (0x7A, 0xA7, 0xF0), "first path": (0x00, 0x72, 0xB2),
             "second path": (0xD5, 0x5E, 0x00)}
"""Fill colours of the light theme (``--dns``, ``--tls``, ``--wait``, ``--s0``, ``--s1``)."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium package"),
]


def chromium(tmp: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=180, cwd=tmp, check=False)


def console(stderr: str) -> list[str]:
    """What the page wrote to the console (errors, CSP violations, uncaught exceptions)."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


@pytest.fixture
def page(tmp_path: Path, doc_keys: dict[str, Any]) -> Path:
    p = tmp_path / "antho.html"
    p.write_text(render_html(with_paths(doc_keys)), encoding="utf-8")
    return p


def test_page_loads_without_console_messages(tmp_path: Path, page: Path) -> None:
    run = chromium(tmp_path, page, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    assert console(run.stderr) == []
    dom = run.stdout
    assert "<h2>Waterfall per connection</h2>" in dom
    assert dom.count("<svg") >= 9
    assert "<script" not in dom


def test_screenshot_shows_the_charts(tmp_path: Path, page: Path) -> None:
    shot = tmp_path / "antho.png"
    run = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,3400")
    assert run.returncode == 0, run.stderr[-2000:]
    assert console(run.stderr) == []
    assert shot.is_file() and shot.stat().st_size > 20_000
    keep = os.environ.get("NETDIAG_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    width, height, bpp, rows = read_png(shot)
    assert (width, height) == (1280, 3400)
    seen = colours(rows, bpp, step=2)
    assert len(seen) > 200                     # text, tables and charts, not a blank page
    missing = [name for name, rgb in PHASE_RGB.items() if bytes(rgb) not in seen]
    assert not missing, f"colours not on screen: {missing}"


def test_hostile_page_stays_inert_in_the_browser(tmp_path: Path,
                                                 doc_keys: dict[str, Any]) -> None:
    p = tmp_path / "hostile.html"
    p.write_text(render_html(hostile_doc(doc_keys), title=HOSTILE), encoding="utf-8")
    run = chromium(tmp_path, p, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    assert console(run.stderr) == []           # no script ran, nothing was fetched
    dom = run.stdout.lower()
    for tag in ("<script", "<img", "<link", "<a href=\"javascript"):
        assert tag not in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
