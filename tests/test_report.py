"""The HTML report: one self-contained page, checked for structure here and in a real headless
browser (Chromium) for console errors and figures that render with a size."""
import os
import shutil
from pathlib import Path

import pytest

from pddsim.cli import main

SMALL = ["--set", "workload.limit=120", "--quiet", "--json"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmp") / "runs"
    assert main(["compare", "configs/same_dc_pd.yaml", "configs/pdd.yaml", "--out", str(folder),
                 *SMALL]) == 0
    page = folder.parent / "report.html"
    assert main(["report", str(folder), "-o", str(page)]) == 0
    return folder, page


def test_report_is_one_self_contained_page(compared):
    _folder, page = compared
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert text.count("<svg") >= 6          # CDF, buckets, and each run's time series
    assert "where the time went" in text and "utilisation per pool" in text
    for ref in ("<script src", "<link ", "src=\"http", "href=\"http", "@import"):
        assert ref not in text                # nothing to fetch: it opens offline


def test_report_of_one_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "configs/pdd.yaml", "--out", str(out), *SMALL]) == 0
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "pdd" in (tmp_path / "r.html").read_text()


def test_report_of_a_folder_without_runs(input_error, tmp_path, capsys):
    code = main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    input_error(code, capsys.readouterr().err, str(tmp_path), "summary.json")


def browser():
    """A headless Chromium driven through its WebDriver, or the reason there is none."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return None, "no chromium and chromedriver on this machine (Debian: chromium chromium-driver)"
    try:
        from selenium import webdriver
    except ImportError:
        return None, "selenium is not installed (the test extra has it)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,2000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver)), ""


def test_report_renders_in_chromium(compared, tmp_path):
    _folder, page = compared
    drv, why = browser()
    if drv is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    try:
        drv.get(Path(page).resolve().as_uri())
        sizes = drv.execute_script(
            "return Array.from(document.querySelectorAll('figure svg'))"
            ".map(e => {const r = e.getBoundingClientRect(); return [r.width, r.height];});")
        errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
        shot = tmp_path / "report.png"
        drv.save_screenshot(str(shot))
    finally:
        drv.quit()
    assert not errors, errors
    assert len(sizes) >= 6
    assert all(w > 100 and h > 50 for w, h in sizes), sizes
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_report_says_what_produced_each_run(compared):
    import json

    import pddsim
    folder, page = compared
    text = page.read_text()
    assert "What produced it" in text and f"<td>{pddsim.__version__}</td>" in text
    for run in sorted(folder.iterdir()):
        made_by = json.loads((run / "provenance.json").read_text())
        assert made_by["config_sha256"][:12] in text and made_by["trace"]["sha256"][:12] in text
