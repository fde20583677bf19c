"""Layer: end to end in a real browser. `syncopate dashboard` is started on a free local port over
the fixture database of `dashboard_data.py` and loaded in a headless Chromium (Debian's
`chromium`, driven by Playwright, which downloads no browser of its own): the overview renders its
table and charts, a filter in the sidebar changes what is shown; on every page of the dashboard and
in `syncopate report`'s file, at 1280 and 1920 px, every chart fits the page (its legend and labels
included) and the browser's console has no warning and no error. Screenshots are kept under
test-artifacts/ (or $SYNCOPATE_TEST_ARTIFACTS).

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


@pytest.fixture(scope="module")
def browser(playwright_api, tmp_path_factory):
    context = playwright_api.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")),
        executable_path=str(CHROMIUM),
        args=CHROMIUM_ARGS,
        headless=True,
    )
    try:
        yield context
    finally:
        context.close()


class Console:
    """The warnings and errors a page logs (its console, and uncaught exceptions)."""

    def __init__(self, page) -> None:
        self.messages: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda e: self.messages.append(f"pageerror: {e}"))

    def _message(self, message) -> None:
        if message.type in ("warning", "error"):
            self.messages.append(f"{message.type}: {message.text}")


def _page(browser, width: int):
    from playwright.sync_api import expect

    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 2400})
    page.set_default_timeout(90_000)
    expect.set_options(timeout=90_000)
    return page, Console(page)


_CHART_BOXES = """(selector) => Array.from(document.querySelectorAll(selector)).map((chart) => {
    const box = chart.getBoundingClientRect();
    const drawn = Array.from(chart.querySelectorAll("svg, canvas")).map((e) => e.getBoundingClientRect());
    return {left: box.left, right: box.right, width: box.width,
            drawn: drawn.map((d) => ({left: d.left, right: d.right, width: d.width}))};
})"""


def _assert_fit(page, selector: str, width: int, where: str) -> int:
    """Every chart matched by `selector` lies within the viewport and draws within its own box; the
    page does not scroll sideways. The number of charts."""
    charts = page.evaluate(_CHART_BOXES, selector)
    for i, chart in enumerate(charts):
        assert chart["drawn"], f"{where}: chart {i} drew nothing"
        assert chart["left"] >= 0 and chart["right"] <= width + 0.5, (
            f"{where}: chart {i} {chart} past {width} px"
        )
        for d in chart["drawn"]:
            assert d["right"] <= chart["right"] + 0.5 and d["right"] <= width + 0.5, f"{where}: chart {i} {d}"
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{where}: the page is {scroll} px wide in a {width} px window"
    return len(charts)


def _wait_for_charts(page, count: int | None = None) -> None:
    from playwright.sync_api import expect

    charts = page.locator('[data-testid="stVegaLiteChart"]')
    if count is not None:
        expect(charts).to_have_count(count)
    for i in range(charts.count()):
        expect(charts.nth(i).locator("svg, canvas").first).to_be_visible()
    page.wait_for_timeout(1500)  # a chart sized to its container settles after its first frame


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_dashboard_chart_fits_the_page_and_the_console_is_clean(browser, dashboard, width):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, console = _page(browser, width)
    try:
        page.goto(dashboard)
        expect(page.get_by_role("heading", name="Overview: best configuration per shape")).to_be_visible()
        _wait_for_charts(page, 6)  # three panels: speedups, bound and times; bound; speedups and times
        assert _assert_fit(page, '[data-testid="stVegaLiteChart"]', width, f"overview at {width} px") == 6
        page.screenshot(path=str(ARTIFACTS / f"dashboard-overview-{width}.png"), full_page=True)

        page.get_by_text("Workload", exact=True).first.click()
        expect(page.get_by_role("heading", name="Workload drill-down")).to_be_visible()
        _wait_for_charts(page, 4)  # convergence, backend × num_splits, tile orders, failures
        _assert_fit(page, '[data-testid="stVegaLiteChart"]', width, f"workload at {width} px")
        page.screenshot(path=str(ARTIFACTS / f"dashboard-workload-{width}.png"), full_page=True)

        page.get_by_text("Sweeps", exact=True).first.click()
        expect(page.get_by_role("heading", name="Two sweeps side by side")).to_be_visible()
        for box, option in (("Sweep A", "1: llama"), ("Sweep B", "2: llama-upgrade")):
            page.get_by_role("combobox", name=box).click()
            page.get_by_role("option", name=option).click()
        expect(page.get_by_text("Sweep 2 against sweep 1")).to_be_attached()
        _wait_for_charts(page, 1)
        _assert_fit(page, '[data-testid="stVegaLiteChart"]', width, f"sweeps at {width} px")
        labels = page.locator('[data-testid="stVegaLiteChart"] text').all_text_contents()
        assert "ag_gemm 8192×2048×8192 bf16 · H200x2-nvlink · measured" in labels  # the shape, not cut
        page.screenshot(path=str(ARTIFACTS / f"dashboard-sweeps-{width}.png"), full_page=True)
    finally:
        page.close()
    assert console.messages == [], "\n".join(console.messages)


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_report_chart_fits_the_page(browser, tmp_path, width):
    """The report's charts are inline SVG, as wide as a page of 1150 px and scaled down on a narrower
    one; its tables scroll in their own box where they are wider than the page."""
    pytest.importorskip("vl_convert", reason="the dashboard extra (vl-convert) is not installed")
    from syncopate.dashboard.report import ReportOptions, write_report
    from syncopate.results_db import ResultsDB

    url = fx.build(tmp_path / "results.db")
    out = tmp_path / "report.html"
    with ResultsDB.open(url, read_only=True) as db:
        write_report(db, out, ReportOptions(drill_down=2, compare=(1, 2)))
    page, console = _page(browser, width)
    try:
        page.goto(out.as_uri())
        count = _assert_fit(page, ".chart", width, f"report at {width} px")
        # every chart of the file: the overview's six, the first drill-down's four, the comparison
        assert count == out.read_text().count('<div class="chart">') >= 6 + 4 + 1
        page.screenshot(path=str(ARTIFACTS / f"report-{width}.png"), full_page=True)
    finally:
        page.close()
    assert console.messages == [], "\n".join(console.messages)


def test_overview_in_chromium_and_a_filter(browser, dashboard):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, console = _page(browser, 1400)
    try:
        page.goto(dashboard)
        expect(page.get_by_role("heading", name="Overview: best configuration per shape")).to_be_visible()

        charts = page.locator('[data-testid="stVegaLiteChart"]')
        expect(charts).to_have_count(6)
        for i in range(6):
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
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

        page.get_by_role("combobox", name="dtype").click()
        page.get_by_role("option", name="fp16").click()
        page.keyboard.press("Escape")
        expect(page.get_by_text("dtype fp16", exact=True)).to_be_visible()
        expect(summary).to_contain_text("1 shape(s)")
        expect(table.locator('[role="row"]')).to_have_count(1 + 1)
        cells = table.locator('[role="gridcell"]').all_inner_texts()
        assert "fp16" in cells and "800" in cells and "bf16" not in cells and "H100x8-nvswitch" not in cells
        # No baselines for that shape: the speedup and bound charts give way to a note; the times remain.
        expect(charts).to_have_count(1)
        expect(page.get_by_text("No speedups to draw", exact=False)).to_have_count(1)
        expect(charts.first.locator("svg, canvas").first).to_be_visible()
        expect(charts.first.locator("text", has_text="8192×4096×8192 fp16").first).to_be_attached()
        assert not [t for t in charts.first.locator("text").all_text_contents() if "bf16" in t]
        page.screenshot(path=str(ARTIFACTS / "dashboard-overview-fp16.png"), full_page=True)
    finally:
        page.close()
    assert (ARTIFACTS / "dashboard-overview.png").stat().st_size > 10_000
    assert console.messages == [], "\n".join(console.messages)
