"""Layer: end to end in a real browser. `syncopate dashboard` is started on a free local port over
the fixture database of `dashboard_data.py` and loaded in a headless Chromium (Debian's
`chromium`, driven by Playwright, which downloads no browser of its own): the overview renders its
table and charts, a filter in the sidebar changes what is shown, and screenshots of both are kept
under test-artifacts/ (or $SYNCOPATE_TEST_ARTIFACTS).

Skips with its reason where Chromium or Playwright is missing, except in CI (CI=true), where it
fails instead: .ci/run installs both."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dashboard_data as fx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ARTIFACTS = Path(
    os.environ.get("SYNCOPATE_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts")
)


def _need(condition: bool, reason: str) -> None:
    if not condition:
        if IN_CI:
            pytest.fail(f"{reason} (CI must run the browser test: see .ci/run)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def playwright_api():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    _need(
        sync_playwright is not None,
        "Playwright is not installed (pip install playwright; no browser download)",
    )
    _need(CHROMIUM.exists(), f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        yield p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """`syncopate dashboard` serving the fixture database; its base URL."""
    url = fx.build(tmp_path_factory.mktemp("browser") / "results.db")
    port = _free_port()
    log = tmp_path_factory.mktemp("browser-log") / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "syncopate",
                "dashboard",
                "--db",
                url,
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"syncopate dashboard exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"syncopate dashboard did not answer on {base} within 120 s:\n{log.read_text()}")
            time.sleep(0.5)
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def test_overview_in_chromium_and_a_filter(playwright_api, dashboard, tmp_path):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = playwright_api.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"),
        executable_path=str(CHROMIUM),
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1500, "height": 2200},
    )
    try:
        page = context.new_page()
        page.set_default_timeout(90_000)
        expect.set_options(timeout=90_000)
        page.goto(dashboard)
        expect(page.get_by_role("heading", name="Overview: best configuration per shape")).to_be_visible()

        charts = page.locator('[data-testid="stVegaLiteChart"]')
        expect(charts).to_have_count(3)
        for i in range(3):
            expect(charts.nth(i).locator("svg, canvas").first).to_be_visible()
        expect(charts.locator(".mark-rect path").first).to_be_attached()  # bars were drawn

        table = page.locator('[data-testid="stDataFrame"]')
        expect(table).to_have_count(1)
        expect(table.locator('[role="row"]')).to_have_count(1 + 7)  # header and the seven overview rows
        assert table.locator('[role="columnheader"]').all_inner_texts()[:4] == [
            "topology",
            "environment",
            "source",
            "kind",
        ]
        cells = table.locator('[role="gridcell"]').all_inner_texts()
        assert "H100x8-nvswitch" in cells and "predicted" in cells and "fp16" in cells and "bf16" in cells
        summary = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text="shape(s)")
        expect(summary).to_contain_text("7 shape(s)")
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"))

        page.get_by_role("combobox", name="dtype").click()
        page.get_by_role("option", name="fp16").click()
        page.keyboard.press("Escape")
        expect(page.get_by_text("dtype fp16", exact=True)).to_be_visible()
        expect(summary).to_contain_text("1 shape(s)")
        expect(table.locator('[role="row"]')).to_have_count(1 + 1)
        cells = table.locator('[role="gridcell"]').all_inner_texts()
        assert "fp16" in cells and "800" in cells and "bf16" not in cells and "H100x8-nvswitch" not in cells
        # No baselines for that shape: the speedup and bound charts give way to a note; the times remain.
        expect(page.get_by_text("No speedups to draw", exact=False)).to_be_visible()
        expect(charts).to_have_count(1)
        expect(charts.first.locator("text", has_text="8192×4096×8192 fp16").first).to_be_attached()
        assert not [t for t in charts.first.locator("text").all_text_contents() if "bf16" in t]
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview-fp16.png"))
    finally:
        context.close()
    assert (ARTIFACTS / "dashboard-overview.png").stat().st_size > 10_000
