"""Committed results name no machine: paths in their records are relative to the project or machine-free."""

import json
from pathlib import Path

from attnbench.results import provenance
from attnbench.results.store import read_jsonl

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
