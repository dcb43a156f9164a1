"""Many processes, one store: every process runs the same sweep of short cells on one SQLite store, as N copies of
one `attnbench run` command do on a GPU node (one per core, many cells at once). Checked afterwards: every cell has
exactly one record, no cell ran twice, every process exited 0, and no output mentions a locked database.

    python benchmarks/store_stress.py --procs 16 --cells 400 [--cell-ms 5,50] [--db /tmp/stress.db]

Prints one line per check and the machine; exits 1 when a check fails. tests/test_store.py runs it small.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SUITE = "stress"


def cells(n: int):
    from attnbench.engine.sweep import Cell

    return [Cell(task="t", attention=f"a{i % 15}", config_hash=f"{i:016x}", seed=i // 15) for i in range(n)]


def worker(db: str, n: int, cell_ms: tuple[float, float], ran: str) -> int:
    """One process: the sweep over ``n`` cells; each cell sleeps, then appends its hash and pid to ``ran``."""
    from rich.console import Console

    from attnbench.engine.sweep import CellResult, run_sweep

    rng = random.Random(os.getpid())

    def run_cell(cell, ctx):
        time.sleep(rng.uniform(*cell_ms) / 1000)
        with open(ran, "a") as f:  # one short O_APPEND write per line: lines of processes never interleave
            f.write(f"{cell.config_hash} {os.getpid()}\n")
        return CellResult("ok", metrics={"pid": os.getpid()})

    s = run_sweep(cells(n), run_cell, suite=SUITE, setting=f"{SUITE}/x", db=db, console=Console(width=200),
                  progress=False)
    return s.exit_code()


def stress(procs: int, n: int, db: Path, cell_ms: tuple[float, float] = (5, 50), timeout: float = 900) -> dict:
    """Start ``procs`` workers at once on ``db``; return what the checks need."""
    ran = db.with_suffix(".ran")
    ran.write_text("")
    from attnbench.results.store import Store

    Store(db).close()  # the schema first
    argv = [sys.executable, __file__, "--worker", "--db", str(db), "--cells", str(n), "--cell-ms",
            f"{cell_ms[0]},{cell_ms[1]}", "--ran", str(ran)]
    t0 = time.perf_counter()
    ps = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(procs)]
    outs = [p.communicate(timeout=timeout)[0] for p in ps]
    wall = time.perf_counter() - t0
    with Store(db) as s:
        recs = s.measurements(suite=SUITE)
        leases = s.leases()
    runs_of = Counter(line.split()[0] for line in ran.read_text().splitlines())
    recorded = Counter(m.config_hash for m in recs)
    hashes = {c.config_hash for c in cells(n)}
    return {"procs": procs, "cells": n, "wall_s": wall, "exit_codes": [p.returncode for p in ps],
            "locked": sum("locked" in o.lower() for o in outs), "missing": sorted(hashes - set(recorded)),
            "recorded_twice": sorted(h for h, k in recorded.items() if k > 1),
            "ran_twice": sorted(h for h, k in runs_of.items() if k > 1),
            "not_ok": sorted({m.status for m in recs} - {"ok"}), "leases_left": len(leases),
            "cells_per_process": sorted(Counter(m.metrics["pid"] for m in recs).values()),
            "tail": outs[0][-800:]}


def failures(r: dict) -> list[str]:
    out = []
    if any(c != 0 for c in r["exit_codes"]):
        out.append(f"exit codes {sorted(Counter(r['exit_codes']).items())}")
    for key in ("missing", "recorded_twice", "ran_twice", "not_ok"):
        if r[key]:
            out.append(f"{key}: {len(r[key])} ({', '.join(map(str, r[key][:5]))})")
    if r["locked"]:
        out.append(f"{r['locked']} processes printed 'locked'")
    if r["leases_left"]:
        out.append(f"{r['leases_left']} leases left behind")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=16)
    p.add_argument("--cells", type=int, default=400)
    p.add_argument("--cell-ms", default="5,50", help="each cell sleeps uniformly between these (ms)")
    p.add_argument("--db", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ran", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    lo, hi = (float(x) for x in a.cell_ms.split(","))
    if a.worker:
        return worker(a.db, a.cells, (lo, hi), a.ran)
    from attnbench.results.provenance import machine, machine_line

    print(machine_line(machine()))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(a.db) if a.db else Path(tmp) / "stress.db"
        r = stress(a.procs, a.cells, db, (lo, hi))
    bad = failures(r)
    print(f"{a.procs} processes, {a.cells} cells of {lo:g}-{hi:g} ms, one store: {r['wall_s']:.1f} s wall; cells per "
          f"process {r['cells_per_process'][0]}-{r['cells_per_process'][-1]}")
    print(json.dumps({k: (len(v) if isinstance(v, list) and k != "exit_codes" else v) for k, v in r.items()
                      if k not in ("tail", "cells_per_process", "exit_codes")}))
    print("every cell recorded once, none run twice, no lock error" if not bad else "FAILED: " + "; ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
