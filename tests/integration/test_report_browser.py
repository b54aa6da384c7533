"""The report opened in a real headless browser (Debian chromium): it renders with no network and no
script, the verdict banner and the gate tables are in the rendered DOM, and a screenshot is kept."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from core import proc
from core.workspace import Workspace
from tests.unit.certify_fixtures import certify_fake, small_recipe_doc

pytestmark = pytest.mark.slow

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2000",
]


def artifacts_dir() -> Path:
    root = Workspace.from_env(os.environ).root / "test-artifacts"
    root.mkdir(parents=True, exist_ok=True)
    return root


def browse(page: Path, profile: Path, *extra: str) -> str:
    # A fresh profile per call: nothing cached, nothing shared with a user's browser.
    profile.mkdir(parents=True, exist_ok=True)
    argv = [BROWSER, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()]
    return proc.run(argv, no_output_timeout=120).output


@pytest.mark.skipif(BROWSER is None, reason="chromium is not installed (.ci/run installs it)")
@pytest.mark.parametrize("verdict", ["PASS", "FAIL"])
def test_report_renders_in_chromium(tmp_path: Path, verdict: str) -> None:
    doc = small_recipe_doc(decode_tok_s_min=1e9) if verdict == "FAIL" else small_recipe_doc()
    w = certify_fake(tmp_path, doc)
    assert w.verdict.status.value == verdict
    dom = browse(w.html, tmp_path / "profile-dom", "--dump-dom")
    assert "<html" in dom, dom[-2000:]
    banner = re.search(r'<div class="banner (\w+)" id="verdict">\s*Verdict: (\w+)', dom)
    assert banner is not None and banner.groups() == (verdict, verdict)
    for heading in (
        "Staging parity gate",
        "Backend agreement gate",
        "Useful-speed gate",
        "Route change",
        "Identity chain",
        "Verification state",
    ):
        assert re.search(rf"<h2( id=\"[\w-]+\")?>{heading}</h2>", dom), heading
    assert dom.count('class="dataframe gate"') == 3
    assert "top-1 agreement" in dom and "staged/monolithic decode" in dom
    assert "Not applicable: " in dom  # the fake certifies the CPU lane, the reference itself
    assert dom.count("<svg") == 2
    shot = artifacts_dir() / f"report-{verdict.lower()}.png"
    shot.unlink(missing_ok=True)
    browse(w.html, tmp_path / "profile-shot", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000, len(data)
    print(f"\nreport screenshot ({verdict}): {shot}")
