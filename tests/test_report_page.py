"""``attnbench report``: the page of the committed results, opened in a real headless Chromium.

The browser test needs Debian's chromium and the playwright package (it drives the system browser; playwright's own
browser download is not used). When either is missing the test is skipped saying how to install them, except
where ``ATTNBENCH_REQUIRE_BROWSER=1`` (CI sets it: there a missing browser fails the run):

    apt-get install -y chromium chromium-driver
    pip install playwright

The screenshot is always written under pytest's tmp dir; ``ATTNBENCH_REPORT_SCREENSHOT=1`` also keeps it at
``results/report/screenshot.png`` (``=<path.png>``: there instead). Nothing tracked is written otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.views import report as reportpage
from attnbench.views import tables
from attnbench.views.sources import load_sources, reference_files

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

CHROMIUM = os.environ.get("ATTNBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(__file__).resolve().parent.parent / "results" / "report" / "screenshot.png"
INSTALL = ("the report page is tested in a real headless browser: install it with "
           "`apt-get install -y chromium chromium-driver` and `pip install playwright` "
           "(do not run `playwright install`; the test drives the system chromium at {path})")


def committed_suites() -> list[str]:
    """Registered suites with committed reference results (what the page of the committed results must show)."""
    return [s for s in suite_registry.suite_names() if reference_files(s)]


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    written = reportpage.write_report(out, include_store=False)   # the committed results only
    return written


def _no_browser(why: str) -> None:
    # a user's machine may lack a browser (the test says how to get one); CI's must have it
    message = why + ": " + INSTALL.format(path=CHROMIUM)
    if os.environ.get("ATTNBENCH_REQUIRE_BROWSER") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("playwright is not installed")
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        _no_browser(f"no chromium at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _open(browser, written, width: int):
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:120]} ({r.failure})"))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(written.path.resolve().as_uri())
    page.wait_for_load_state("load")
    return page, problems, requests


def test_report_page_in_chromium(page_file, browser, tmp_path):
    written = page_file
    suites = committed_suites()
    assert suites, "no committed results under results/: nothing to report"
    page, problems, requests = _open(browser, written, 1280)
    assert problems == []
    # self-contained: the page itself and nothing else is fetched (figures are data: URIs)
    assert [u for u in requests if not u.startswith("data:")] == [written.path.resolve().as_uri()]

    # every table and figure the generator says it wrote is in the page, and every figure decoded
    assert page.locator("table").count() == written.tables
    assert page.locator("img").count() + page.locator("svg").count() == written.figures
    assert written.figures > 0
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    for s in suites:
        assert page.locator(f"#suite-{s} table").count() >= 1, f"suite {s} has no table in the page"
        n_views = sum(len(tables.source_tables(tables.view_of(s), src))
                      for src in load_sources(s, include_store=False))
        assert page.locator(f"#suite-{s} .board:not(.reported) table").count() == n_views
    # the papers' tables are labelled as reported, and measured tables carry their provenance
    assert page.locator(".board.reported").count() >= 1
    assert page.locator(".board.reported .badge").first.inner_text().startswith("reported")
    measured = page.locator(".board:not(.reported)")
    assert measured.count() == page.locator(".board:not(.reported) dl.prov").count()
    prov = measured.first.locator("dl.prov").inner_text()
    for field in ("machine", "commit", "packages"):
        assert field in prov

    shot = tmp_path / "report-screenshot.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("ATTNBENCH_REPORT_SCREENSHOT")
    if keep:
        keep = SCREENSHOT if keep == "1" else keep
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)

    # sorting: a click on the header of a column of numbers orders its rows by value (units understood)
    table = page.locator("table.board-table").filter(has=page.locator("th.num")).first
    heads = table.locator("thead th")
    col = heads.evaluate_all("ths => ths.findIndex(t => t.classList.contains('num'))")
    heads.nth(col).locator("button").click()
    cells = table.locator(f"tbody tr td:nth-child({col + 1})").all_inner_texts()
    keys = [float(m.group()) for c in cells for m in [re.match(r"-?\d+(\.\d+)?", c.replace(",", ""))] if m]
    assert len(keys) >= 2 and keys == sorted(keys), cells
    assert heads.nth(col).get_attribute("aria-sort") == "ascending"
    heads.nth(col).locator("button").click()
    assert heads.nth(col).get_attribute("aria-sort") == "descending"
    cells = table.locator(f"tbody tr td:nth-child({col + 1})").all_inner_texts()
    keys = [float(m.group()) for c in cells for m in [re.match(r"-?\d+(\.\d+)?", c.replace(",", ""))] if m]
    assert keys == sorted(keys, reverse=True) and problems == []
    page.close()


def test_report_page_narrow_screen(page_file, browser, tmp_path):
    """On a phone-width screen the page never scrolls sideways: wide tables scroll inside their own box."""
    page, problems, _ = _open(browser, page_file, 375)
    assert problems == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    assert page.evaluate("document.body.scrollWidth") <= 375
    # a wide table is wider than the screen, but inside a scroll box
    assert page.evaluate("Array.from(document.querySelectorAll('table')).some(t => t.scrollWidth > 375)")
    page.screenshot(path=str(tmp_path / "report-narrow.png"))
    page.close()


def test_report_page_printed(page_file, browser, tmp_path):
    """Printed on A4 (the page's print styles), every table fits the paper's width: none is cut off."""
    page, problems, _ = _open(browser, page_file, 718)   # A4 at 96 dpi less 1 cm margins
    page.emulate_media(media="print")
    too_wide = page.evaluate("Array.from(document.querySelectorAll('table')).filter(t => t.scrollWidth > "
                             "t.closest('.board').clientWidth).map(t => t.closest('.board').id)")
    assert too_wide == [] and problems == []
    page.pdf(path=str(tmp_path / "report.pdf"), format="A4",
             margin={"top": "1cm", "bottom": "1cm", "left": "1cm", "right": "1cm"})
    assert (tmp_path / "report.pdf").stat().st_size > 10_000
    page.close()


def test_report_markdown(tmp_path):
    out = tmp_path / "report.md"
    written = reportpage.write_report(out, fmt="md", include_store=False)
    text = out.read_text()
    for s in committed_suites():
        assert f"\n## {s}\n" in text
    # every table (#### title, then a markdown table) and every figure link, each figure a PNG file beside the page
    assert len(re.findall(r"^#### (?!Figures: )", text, flags=re.MULTILINE)) == written.tables
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == written.figures == len(written.files) > 0
    for link in links:
        p = out.parent / unquote(link)
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 0 < written.reported < written.tables
    assert len(re.findall(r"^#### reported", text, flags=re.MULTILINE)) == written.reported   # labelled as such
    assert text.count("Provenance:") == written.tables - written.reported   # under every measured table


def test_report_escapes_everything(tmp_path):
    """Every text from a record or a view reaches the page escaped."""
    evil = "<script>alert(1)</script>"
    board = reportpage.Board((f"t {evil}", ["attention", "x"], [[evil, "1 ^"]], f"cap {evil}"),
                             provenance=[("machine", evil)])
    report = reportpage.Report([reportpage.Section("s<b>", evil, boards=[board], notes=[evil])], evil, evil)
    page = reportpage.render_html(report)
    assert "<script>alert" not in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    assert page.count("<script>") == 1   # the page's own sorting script


def test_report_bad_input(tmp_path):
    with pytest.raises(UnknownNameError, match="lraa"):
        reportpage.write_report(tmp_path / "r.html", suites=["lraa"], include_store=False)
    with pytest.raises(AttnbenchError, match="--db .*no such results store"):
        reportpage.write_report(tmp_path / "r.html", db=str(tmp_path / "missing.db"))
    (tmp_path / "file").write_text("")
    with pytest.raises(AttnbenchError, match="--out .*is a file, not a directory"):
        reportpage.write_report(tmp_path / "file" / "r.html", include_store=False)
    with pytest.raises(AttnbenchError, match="--out .*is a directory"):
        reportpage.write_report(tmp_path, include_store=False)
    with pytest.raises(AttnbenchError, match="--format"):
        reportpage.write_report(tmp_path / "r.html", fmt="pdf", include_store=False)
    assert not (tmp_path / "r.html").exists()


def test_report_command(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "r.html"), "--suite", "lraa", "--no-store"])
    assert res.exit_code != 0 and "lraa" in res.output and len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "r.html"), "--db", str(tmp_path / "no.db")])
    assert res.exit_code != 0 and "no such results store" in res.output
    suite = committed_suites()[0]
    res = runner.invoke(app, ["report", "--out", str(tmp_path / "r.html"), "--suite", suite, "--no-store"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and (tmp_path / "r.html").read_text().count(f'id="suite-{suite}"') == 1


def test_provenance_of_a_table():
    """A table's provenance: each machine with the GFLOP/s measured on it, commits with the dirty flag, packages;
    only the records of the setting its title names."""
    from attnbench.results.records import Measurement

    def rec(setting, name, gflops, commit, dirty):
        metrics = {"matmul_fp32_gflops": gflops} if gflops else {}
        return Measurement(suite="s", task="t", setting=setting, attention="softmax", status="ok", device="cpu",
                           device_name=name, metrics=metrics, git_commit=commit, git_dirty=dirty,
                           packages={"torch": "2.14.1"}, ended_at="2026-11-25T06:00:00+00:00")

    recs = [rec("s/tiny", "CPU A", 101.0, "a" * 40, True), rec("s/tiny-long", "CPU B", None, "b" * 40, False)]
    rows = dict(reportpage.provenance_rows(recs))
    assert "CPU A, fp32 matmul 101 GFLOP/s" in rows["machine"]
    assert "CPU B (matmul GFLOP/s not recorded)" in rows["machine"]
    assert "a" * 40 + " (dirty tree)" in rows["commit"] and "torch 2.14.1" in rows["packages"]
    assert reportpage._records_of("board — s/tiny-long · cpu", recs) == recs[1:]
    assert reportpage._records_of("board — s/tiny · cpu", recs) == recs[:1]
    assert reportpage._records_of("board of everything", recs) == recs
