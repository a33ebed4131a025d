"""The HTML report: one self-contained interactive page, checked for structure here and in a real
headless browser (Chromium) for console errors, figures that render with a size, a hover layer
that answers a hover, and nothing fetched from the network."""
import html
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pddsim.cli import main
from pddsim.report import Run, _windows, time_unit

SMALL = ["--set", "workload.limit=120", "--quiet", "--json"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmp") / "runs"
    assert main(["compare", "configs/same_dc_pd.yaml", "configs/pdd.yaml", "--out", str(folder),
                 *SMALL]) == 0
    page = folder.parent / "report.html"
    assert main(["report", str(folder), "-o", str(page)]) == 0
    return folder, page


def figures(text: str) -> list[dict]:
    """The figure specs the page draws."""
    return json.loads(re.search(r"const specs = (.*?);\nspecs\.forEach", text, re.S)[1])


def markup(text: str) -> str:
    """The page without its scripts: what a browser would fetch from is named here."""
    return re.sub(r"<script>.*?</script>", "", text, flags=re.S)


def test_report_is_one_self_contained_interactive_page(compared):
    _folder, page = compared
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "Plotly.newPlot" in text and len(text) > 1_000_000      # the library is inside
    for ref in ("<script src", "<link ", "src=\"http", "href=\"http", "src='http", "@import"):
        assert ref not in markup(text)        # nothing to fetch: it opens offline
    shown = figures(text)
    assert text.count("<div class='fig'") == len(shown) >= 7
    titles = [f["layout"]["title"]["text"] for f in shown]
    assert {"TTFT distribution (completed requests)", "TTFT P90 per arrival window",
            "SLO attainment per arrival window", "link throughput"} <= set(titles)
    for f in shown:                            # legends above the plot, off the data
        assert f["layout"]["legend"]["y"] > 1
    assert "where the time went" in text and "utilisation per pool" in text
    assert text.index("What produced it") < text.index("Headline")      # provenance first


def test_headline_table_has_units_and_deltas_against_the_first(compared):
    _folder, page = compared
    text = markup(page.read_text())
    rows = table_rows(text[text.index("<h2>Headline"):])
    assert rows[0] == ["", "same_dc_pd", "pdd"]
    table = {r[0]: r[1:] for r in rows[1:]}
    assert {"TTFT P90 s", "cost $/h", "goodput rps", "WAN GB"} <= set(table)
    assert re.fullmatch(r"-?[\d.]+ \([+-]\d+%\)", table["cost $/h"][1])
    assert "wall_s" not in table and "e" not in table["WAN GB"][1]


def table_rows(text: str) -> list[list[str]]:
    """The cells of the first table in `text`, row by row."""
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        rows: list[list[str]] = []
        done = False

        def handle_starttag(self, tag, attrs):
            if tag == "tr" and not self.done:
                self.rows.append([])
            elif tag in ("td", "th") and not self.done:
                self.rows[-1].append("")

        def handle_endtag(self, tag):
            self.done = self.done or tag == "table"

        def handle_data(self, data):
            if self.rows and self.rows[-1] and not self.done:
                self.rows[-1][-1] += data.strip()
    parser = Cells()
    parser.rows = []
    parser.feed(text)
    return parser.rows


def test_time_axes_are_shared_human_and_break_at_empty_windows(compared):
    folder, page = compared
    shown = {f["layout"]["title"]["text"]: f for f in figures(page.read_text())}
    runs = [Run(p) for p in sorted(folder.iterdir())]
    span = max(r.summary["sim_duration_s"] for r in runs)
    unit, per = time_unit(span)
    assert unit == "min" and per == 60 and time_unit(3 * 3600) == ("h", 3600.0)
    ttft = shown["TTFT P90 per arrival window"]
    assert [t["name"] for t in ttft["data"]] == ["same_dc_pd", "pdd"]     # one axis, overlaid
    assert ttft["layout"]["xaxis"]["title"]["text"] == "arrival time (min)"
    assert max(x for t in ttft["data"] for x in t["x"] if x is not None) <= span / 60
    # a window without arrivals is a gap (null), never a line drawn across it
    w = _windows(runs[0])
    raw = runs[0].table("windows")
    assert len(w) > (raw["bucket"] == "all").sum() and w["ttft_p90_s"].isna().any()
    assert None in ttft["data"][0]["y"] and ttft["data"][0]["connectgaps"] is False
    slo = [s["label"]["text"] for s in ttft["layout"]["shapes"]]
    assert slo == ["SLO 5 s"] and ttft["layout"]["shapes"][0]["y0"] == 5.0
    cdf = shown["TTFT distribution (completed requests)"]
    assert cdf["layout"]["shapes"][0]["x0"] == 5.0
    attainment = shown["SLO attainment per arrival window"]
    assert attainment["layout"]["shapes"][0]["label"]["text"] == "SLO target 90%"
    links = shown["link throughput"]
    assert links["layout"]["yaxis"]["title"]["text"] == "Gb/s"
    wan = next(t for t in links["data"] if t["name"] == "pdd: wan left by background")
    ts = runs[1].table("timeseries")
    capacity = ts[(ts["entity"] == "wan") & (ts["metric"] == "capacity_Bps")]["value"]
    assert np.allclose(wan["y"], capacity * 8 / 1e9)


def test_report_of_one_run_and_its_provenance(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "configs/pdd.yaml", "--out", str(out), *SMALL]) == 0
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "pdd" in (tmp_path / "r.html").read_text()
    # a run folder that recorded its provenance shows it at the top
    (out / "provenance.json").write_text(json.dumps({"pddsim": "9.9.9", "seed": 7,
                                                      "config": {"slo": {"ttft_s": 5}}}))
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    text = markup((tmp_path / "r.html").read_text())
    head = text[text.index("What produced it"):text.index("Headline")]
    assert "9.9.9" in head and "seed" in head and "ttft_s" in head
    summary = json.loads((out / "summary.json").read_text())       # or a block in the summary
    (out / "summary.json").write_text(json.dumps({**summary, "provenance": {"pddsim": "8.8.8"}}))
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "8.8.8" in markup((tmp_path / "r.html").read_text())


def test_diff_compares_two_saved_runs(tmp_path, capsys, input_error):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", "configs/same_dc_pd.yaml", "--out", str(a), *SMALL]) == 0
    assert main(["run", "configs/same_dc_pd.yaml", "--out", str(b), *SMALL,
                 "--set", "clusters.a.instances.1.count=1"]) == 0
    capsys.readouterr()
    assert main(["diff", str(a), str(b), "-o", str(tmp_path / "d.html")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["same_dc_pd", "(a)", "same_dc_pd", "(b)"]
    cost = next(line for line in out if line.startswith("cost $/h"))
    assert "(-" in cost                        # fewer decoders: cheaper, said as a fall
    assert "same_dc_pd (b)" in (tmp_path / "d.html").read_text()
    code = main(["diff", str(a), str(tmp_path)])
    input_error(code, capsys.readouterr().err, str(tmp_path), "not a run")


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


# every figure drawn with a size; the first one's hover layer, and what a hover puts in it
PROBE = """
const plots = Array.from(document.querySelectorAll('.fig'));
const sizes = plots.map(e => {const s = e.querySelector('svg.main-svg');
  if (!s) return [0, 0]; const r = s.getBoundingClientRect(); return [r.width, r.height];});
const first = plots[0];
const layer = first.querySelector('.hoverlayer') !== null;
Plotly.Fx.hover(first, [{curveNumber: 0, pointNumber: 10}]);
const hovered = first.querySelectorAll('.hoverlayer .hovertext').length;
const fetched = performance.getEntriesByType('resource').map(e => e.name);
return [plots.length, sizes, layer, hovered, fetched];
"""


def check_in_browser(page: Path, tmp_path: Path) -> tuple:
    drv, why = browser()
    if drv is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    try:
        drv.get(Path(page).resolve().as_uri())
        found = drv.execute_script(PROBE)
        errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
        shot = tmp_path / f"{page.stem}.png"
        drv.save_screenshot(str(shot))
    finally:
        drv.quit()
    assert not errors, errors
    print(f"screenshot: {shot}")
    return (*found, shot)


def test_report_renders_and_responds_in_chromium(compared, tmp_path):
    _folder, page = compared
    count, sizes, layer, hovered, fetched, shot = check_in_browser(page, tmp_path)
    assert count == len(figures(page.read_text())) >= 7
    assert all(w > 100 and h > 50 for w, h in sizes), sizes
    assert layer and hovered >= 1              # the figure answers a hover with its values
    assert fetched == []                       # nothing from the network
    assert shot.stat().st_size > 10_000


def test_plan_and_sweep_reports_draw_their_figures(tmp_path, capsys):
    """A plan's folder: an interactive heatmap whose cells say each point's outcome, and the
    Pareto front; a sweep's table: each headline metric against the first grid key."""
    from test_plan import VARY, small_config
    plan_out = tmp_path / "plan"
    assert main(["plan", str(small_config(tmp_path)), *(f"--vary={v}" for v in VARY), "--budget",
                 "110", "--jobs", "1", "--quiet", "--seed", "0", "--out", str(plan_out)]) == 0
    page = tmp_path / "plan.html"
    assert main(["report", str(plan_out), "-o", str(page)]) == 0
    made_by = json.loads((plan_out / "provenance.json").read_text())
    assert made_by["config_sha256"][:12] in markup(page.read_text())
    shown = figures(page.read_text())
    heat, pareto = shown
    assert heat["data"][0]["type"] == "heatmap"
    cells = [c for row in heat["data"][0]["text"] for c in row]
    assert len(cells) == 6 and all(cells)                         # no cell left blank
    assert {t["name"] for t in pareto["data"]} >= {"measured", "Pareto front"}
    count, sizes, _layer, _hovered, fetched, _shot = check_in_browser(page, tmp_path)
    assert count == 2 and all(w > 100 and h > 50 for w, h in sizes) and fetched == []

    table = tmp_path / "sweep.parquet"
    assert main(["sweep", "configs/same_dc_pd.yaml", "--grid", "clusters.a.instances.1.count=1,2",
                 "--grid", "slo.ttft_s=5,10", "--set", "workload.limit=60", "--jobs", "1",
                 "--quiet", "--json", "--out", str(table)]) == 0
    page = tmp_path / "sweep.html"
    assert main(["report", str(table), "-o", str(page)]) == 0
    made_by = json.loads((tmp_path / "sweep.parquet.provenance.json").read_text())
    assert made_by["command"] in html.unescape(markup(page.read_text()))
    shown = {f["layout"]["title"]["text"]: f for f in figures(page.read_text())}
    goodput = shown["goodput (req/s) against clusters.a.instances.1.count"]
    assert [t["name"] for t in goodput["data"]] == ["slo.ttft_s=5", "slo.ttft_s=10"]
    assert goodput["data"][0]["x"] == ["1", "2"]


def test_report_says_what_produced_each_run(compared):
    import pddsim
    folder, page = compared
    text = page.read_text()
    assert "What produced it" in text and f"<td>{pddsim.__version__}</td>" in text
    for run in sorted(folder.iterdir()):
        made_by = json.loads((run / "provenance.json").read_text())
        assert made_by["config_sha256"][:12] in text and made_by["trace"]["sha256"][:12] in text
