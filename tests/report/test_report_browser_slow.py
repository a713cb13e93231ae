"""``report.html`` from a ``labelrl demo --fast`` run, opened in a real (headless) Chromium: every
figure decodes, the verdict grid and every section heading are on the page, and the page logs no
console errors. The system Chromium and its driver come from Debian's packages (`make test-slow`
installs them); no browser is downloaded at run time. Without them the test skips and says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no system Chromium and chromedriver (`make chromium` installs them from Debian's packages as root)")
    return browser, driver


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "demo", "--fast", "--out", "demo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "demo" / "report" / "report.html"


@pytest.fixture(scope="module")
def page(demo_report):
    browser, driver_path = chromium_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(demo_report.as_uri())
        yield driver
    finally:
        driver.quit()


def test_every_figure_decodes(page):
    sizes = page.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]);")
    assert len(sizes) >= 5, sizes  # the demo's report draws curves, ROC and more
    broken = [alt for alt, complete, width, height in sizes if not (complete and width > 0 and height > 0)]
    assert not broken, f"figures that did not decode: {broken}"


def test_the_grid_and_every_section_heading_render(page):
    from labelrl.report import SECTIONS

    headings = page.execute_script("return Array.from(document.querySelectorAll('h2')).map(h => [h.id, h.innerText]);")
    shown = {anchor: text for anchor, text in headings}
    for anchor, title in SECTIONS:
        assert shown.get(anchor) == title, (anchor, title, headings)
    # the verdict opens with each task's answer sentence and its grid: rows are RL arms
    grids = page.execute_script(
        "return Array.from(document.querySelectorAll('table')).filter(t => t.caption && "
        "t.caption.innerText.includes('Holm correction') && t.tHead.innerText.trim().startsWith('arm'))"
        ".map(t => Array.from(t.tBodies[0].rows).map(r => r.cells[0].innerText));")
    assert len(grids) == 2, grids  # sms-spam and vader-movies
    # an arm's name, then its collapse mark where a run collapsed (tiny-random's runs inherit their
    # SFT parent's one answer: "grpo (collapsed, inherited)"; labelrl.ladder.grid.row_name)
    arms = [[name.split(" (")[0] for name in grid] for grid in grids]
    assert ["grpo"] in arms and sorted(max(arms, key=len)) == ["corpo", "dr_grpo", "grpo"]
    first = page.execute_script("return document.querySelector('h2').id;")
    assert first == "verdict"  # the first screen is the verdict


def test_the_page_logs_no_console_errors(page):
    errors = [entry for entry in page.get_log("browser") if entry.get("level") == "SEVERE"]
    assert not errors, errors
