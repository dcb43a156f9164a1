"""Committed results name no machine (paths in their records are relative to the project or machine-free) and a
commit of this repository's history; an export into results/ takes only records of a clean tree."""

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.records import read_jsonl
from attnbench.views.export import export

ROOT = Path(__file__).resolve().parents[1]


def test_portable_makes_paths_machine_free(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    value = {"checkpoint": str(root / "results" / "runs" / "lm" / "m-1"), "weights": "/tmp/x/w/models/v/a-1.pt",
             "data": "files:/data/lra/listops-1000", "argv": ["attnbench", "run", "--db", "/srv/x/s.db", "--out", "/tmp", "--seq", "1k"],
             "rate": "images/s", "n": 3}
    out = provenance.portable(value, root)
    assert out == {"checkpoint": "results/runs/lm/m-1", "weights": ".../v/a-1.pt", "data": "files:.../lra/listops-1000",
                   "argv": ["attnbench", "run", "--db", ".../x/s.db", "--out", ".../tmp", "--seq", "1k"], "rate": "images/s", "n": 3}


def test_committed_records_hold_no_absolute_path():
    files = sorted((ROOT / "results").glob("*/*.jsonl"))
    assert files
    for f in files:
        for i, r in enumerate(read_jsonl(f), 1):
            text = json.dumps([r.metrics, r.params, r.options])
            found = provenance._ABS_PATH.findall(text)
            assert not found, f"{f.relative_to(ROOT)}:{i}: {found[:3]} (export makes paths portable: re-export it)"


def _git(*args) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def test_an_export_into_the_committed_results_takes_only_records_of_a_clean_tree_in_this_history(tmp_path):
    (clean,) = read_jsonl(ROOT / "results" / "lra" / "tiny-cpu.jsonl")[:1]
    head = _git("rev-parse", "HEAD")
    assert head, "not a git checkout"
    clean = dataclasses.replace(clean, git_commit=head, git_dirty=False)
    target = ROOT / "results" / "_export_check" / "x.jsonl"
    for bad in (dataclasses.replace(clean, git_dirty=True), dataclasses.replace(clean, git_dirty=None),
                dataclasses.replace(clean, git_commit="0" * 40), dataclasses.replace(clean, git_commit=None)):
        with pytest.raises(AttnbenchError, match="results are committed only from a clean tree"):
            export([clean, bad], "jsonl", out=target)
        assert not target.parent.exists()   # nothing written
    assert export([clean], "jsonl", out=tmp_path / "x.jsonl")   # anywhere else: any record


@pytest.mark.skipif(_git("rev-parse", "--is-shallow-repository") != "false", reason="needs the full git history")
def test_committed_records_name_a_commit_of_this_history():
    commits = {r.git_commit for f in (ROOT / "results").glob("*/*.jsonl") for r in read_jsonl(f)}
    assert commits and all(provenance.in_history(c) for c in commits), sorted(c for c in commits
                                                                               if not provenance.in_history(c))


def test_committed_records_come_from_a_clean_tree():
    dirty = {str(f.relative_to(ROOT)): sum(1 for r in read_jsonl(f) if r.git_dirty is not False)
             for f in sorted((ROOT / "results").glob("*/*.jsonl"))}
    assert dirty and not any(dirty.values()), {f: n for f, n in dirty.items() if n}
