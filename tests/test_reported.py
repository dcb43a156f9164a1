"""The papers' reported numbers: data files in one schema (attnbench/results/reported.py), rendered by one function.

The fixture ``data/reported_at_22bbe03.json`` holds the tables as the Python modules they replaced rendered them
(suites/{vision,lra,lm}/reported.py at commit 22bbe03): every number, header and caption must survive the move.
"""

import json
from pathlib import Path

import pytest

from attnbench.results import reported as R

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((Path(__file__).with_name("data") / "reported_at_22bbe03.json").read_text(encoding="utf-8"))
# the one deliberate change: the LM table's title now has the same shape as every other (label — setting)
LM_TITLE_BEFORE = "lm reported — NaLaFormer Table 5 (340M / 15B tokens)"
LM_TITLE_NOW = "reported (NaLaFormer Table 5, 340M / 15B tokens) — lm/340m"


def folder(suite: str) -> Path:
    return ROOT / "suites" / suite / "reported"


def as_lists(tables) -> list:
    return [list(t) for t in tables]


def test_vision_tables_render_exactly_as_before():
    tables = R.load_dir(folder("vision"))
    assert as_lists(R.render(tables)) == FIXTURE["vision_all"]
    shown = [t[0] for t in R.leaderboard_tables(folder("vision"))]
    assert shown == FIXTURE["vision_leaderboard_titles"] and len(shown) < len(tables)  # ablations are not shown


def test_lra_table_renders_exactly_as_before_and_keeps_throughput_and_memory():
    assert as_lists(R.leaderboard_tables(folder("lra"))) == FIXTURE["lra_leaderboard"]
    eff = [t for t in R.load_dir(folder("lra")) if not t.leaderboard]
    assert len(eff) == 1
    (before,) = FIXTURE["lra_efficiency"]
    assert [r.method for r in eff[0].rows] == [r["method"] for r in before["rows"]]
    for row, old in zip(eff[0].rows, before["rows"]):
        assert {k[:-2]: v for k, v in row.values.items() if k.endswith("_t")} == old["throughput"]
        assert {k[:-2]: v for k, v in row.values.items() if k.endswith("_m")} == old["memory_mb"]


def test_lm_table_renders_as_before_but_for_its_title():
    (before,) = FIXTURE["lm_leaderboard"]
    (now,) = as_lists(R.leaderboard_tables(folder("lm")))
    assert before[0] == LM_TITLE_BEFORE and now[0] == LM_TITLE_NOW
    assert now[1:] == before[1:]


@pytest.mark.parametrize("suite", ["vision", "lra", "lm"])
def test_the_leaderboard_view_shows_the_data_files(suite):
    """``attnbench table <suite>`` prints its view's extra tables: they are the rendered data files."""
    import importlib

    extra = importlib.import_module(f"attnbench.suites.{suite}.leaderboard").view().extra_data()
    assert as_lists(extra) == as_lists(R.leaderboard_tables(folder(suite))) and extra


def test_every_suite_folder_is_package_data():
    """pyproject's package-data glob for attnbench.suites ships every reported file of an installed package."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["attnbench.suites"]
    files = [p.relative_to(ROOT / "suites").as_posix() for p in (ROOT / "suites").glob("*/reported/*")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), files


GOOD = """paper = "P"
citation = "A. Author, 'A title', arXiv 0000.00000"
columns = [
  {key = "top1", header = "top-1 (%)", unit = "%", direction = "higher", decimals = 1},
]

[[table]]
label = "reported (P Table 1)"
source = "Table 1"
setting = "s"
notes = "n."
rows = [
  {method = "Ours", attention = "nala", options = {power = 3.0}, top1 = 80.25},
  {method = "Other", top1 = 79.0, note = "x"},
]
"""


def test_a_small_file_renders_with_options_notes_and_at_least_the_declared_decimals(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(GOOD, encoding="utf-8")
    ((title, header, rows, cap),) = R.render(R.load(p))
    assert title == "reported (P Table 1) — s" and header == ["method [attnbench name]", "top-1 (%)", "note"]
    assert rows == [["Ours [nala(power=3)]", "80.25", ""], ["Other", "79.0", "x"]]
    assert cap == "Published numbers, not measured by attnbench. Source: A. Author, 'A title', arXiv 0000.00000, " \
                  "Table 1. n."


@pytest.mark.parametrize("old, new, line, words", [
    ('attention = "nala"', 'attention = "nalla"', 13, "did you mean nala"),
    ("top1 = 79.0,", "top1 = 179.0,", 14, "not a percentage"),
    ("top1 = 79.0,", "top_1 = 79.0,", 14, "not columns of this table"),
    ("top1 = 79.0,", 'top1 = "79",', 14, "finite number"),
    ('{method = "Other", ', "{", 14, "needs a 'method'"),
    ("options = {power = 3.0}, ", "", 13, None),  # fine without options
    ('attention = "nala", ', "", 13, "options but no attention"),
    ('direction = "higher"', 'direction = "up"', 4, "direction must be"),
    ('setting = "s"\n', "", 7, "needs a string 'setting'"),
    ('notes = "n."', 'notes = "n."\nfoo = 1', 7, "unknown table field"),
    ('label = "reported (P Table 1)"', 'label = "reported (P Table 1)', 8, "not valid TOML"),
    ('citation = "A. Author, \'A title\', arXiv 0000.00000"\n', "", 1, "'citation'"),
])
def test_a_bad_file_gets_one_line_naming_file_and_line(tmp_path, old, new, line, words):
    p = tmp_path / "bad.toml"
    assert old in GOOD
    p.write_text(GOOD.replace(old, new, 1), encoding="utf-8")
    if words is None:
        assert R.load(p)
        return
    with pytest.raises(R.ReportedError) as e:
        R.load(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}:{line}: ") and words in msg, msg


def test_a_label_used_twice_in_a_folder_is_an_error(tmp_path):
    (tmp_path / "a.toml").write_text(GOOD, encoding="utf-8")
    (tmp_path / "b.toml").write_text(GOOD, encoding="utf-8")
    with pytest.raises(R.ReportedError, match=r"b\.toml:7: label 'reported \(P Table 1\)' is already used at .*a\.toml:7"):
        R.load_dir(tmp_path)
    with pytest.raises(R.ReportedError, match="no reported-numbers files"):
        R.load_dir(tmp_path / "empty")
