"""``attnbench show SUITE ROW``: how a leaderboard row was made, as the exact command that makes it again.

A row is addressed as the table shows it: ROW is the text of its first column (the spec, e.g. ``nala`` or
``laplacian:landmarks=16``; the LRA table's ``name(key=value)`` spelling works too), narrowed by ``--task`` and
``--setting`` when the suite's tables have several, or a config hash (or a unique prefix of one, from ``attnbench
export``) of one of its cells. For each seed of the row it prints the point's identity (config hash), the preset's
identity, the commit that measured it (dirty or not) and the commands: ``git checkout COMMIT`` and ``attnbench run
...`` with the spec, the task, the seed and the store. Run again, that command plans the same cell identity, so a
store that has it skips it (``--force`` measures it again).

The command is the run's own command line (recorded with the run in the store) narrowed to the cell: ``--attn``
set to the row's spec and ``--tasks`` to its task where the suite's run command has those options, ``--seed`` to
the seed, and the options that only split or launch work (``--shard``, ``--launcher``, ``--force``, ...) left out.
Committed results carry no command line: theirs is rebuilt from the record (suite, ``--preset`` name, spec, task,
seed) and says so.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Optional

from attnbench.core.errors import AttnbenchError
from attnbench.engine.argv import strip_options
from attnbench.results.records import Measurement
from attnbench.results.store import open_existing
from attnbench.views.rows import label_of, seed_rows
from attnbench.views.sources import load_sources

#: Options of a recorded command line that only split, launch or force work: not part of what a cell is.
DROP = {"--shard": True, "--launcher": True, "--jobs": True, "--partition": True, "--gpus-per-job": True,
        "--job-minutes": True, "--force": False, "--seed": True, "--seeds": True, "--attn": True, "--tasks": True}


def _canon(label: str) -> str:
    """``name(k=v,k2=v2)`` and ``name:k=v:k2=v2`` as one spelling (no spaces)."""
    s = label.replace(" ", "")
    m = re.fullmatch(r"([^()]+)\((.*)\)", s)
    if m:
        s = ":".join([m.group(1), *[p for p in m.group(2).split(",") if p]])
    return s.lower()


def _row_names(r: Measurement) -> set[str]:
    names = {r.attention, label_of(r)}
    if r.options:
        names.add(r.attention + "(" + ",".join(f"{k}={v}" for k, v in sorted(r.options.items())) + ")")
    return {_canon(n) for n in names}


@dataclasses.dataclass
class Row:
    source: str
    committed: bool
    records: list[Measurement]  # one per seed


def find_rows(suite: str, row: str, *, db: Optional[str] = None, setting: Optional[str] = None,
              task: Optional[str] = None, committed: bool = True) -> list[Row]:
    """The leaderboard rows of ``suite`` that ``row`` names (see the module docstring), from the user's store and
    the committed results."""

    sources = load_sources(suite, db=db, include_committed=committed, setting=setting)
    want = _canon(row)
    is_hash = bool(re.fullmatch(r"[0-9a-f]{6,}", row))
    out = []
    for src in sources:
        for key, recs in seed_rows(src.records).items():
            if task is not None and key[3] != task:
                continue
            if is_hash:
                recs = [r for r in recs if r.config_hash.startswith(row)]
                if recs:
                    out.append(Row(src.label, src.committed, recs))
            elif want in _row_names(recs[-1]):
                out.append(Row(src.label, src.committed, recs))
    return out


def command(r: Measurement, *, options: set[str], argv: Optional[list[str]] = None,
            db: Optional[str] = None) -> tuple[list[str], bool]:
    """``attnbench run ...`` that makes ``r``'s cell again, and whether it came from the run's recorded command
    line (else rebuilt from the record). ``options``: the option names ``attnbench run SUITE`` takes."""
    recorded = False
    if argv and "run" in argv[1:]:
        rest = argv[argv.index("run", 1) + 1:]
        if rest and rest[0] == r.suite:
            base = strip_options(rest[1:], DROP)
            recorded = True
    if not recorded:
        base = []
        if "--preset" in options and r.params.get("preset"):
            base += ["--preset", str(r.params["preset"])]
    # the plug-ins as the record names them (absolute paths or modules), not as the run's working directory did;
    # the store shown, not the one the run wrote (a launcher's job wrote a shard store, since merged)
    base = strip_options(base, {"--plugin": True, "--db": True})
    plugin_args = [a for src in sorted(k.removeprefix("plugin:") for k in (r.packages or {}) if k.startswith("plugin:"))
                   for a in ("--plugin", src)]
    args = ["attnbench", "run", r.suite, *plugin_args, *base]
    if db and "--db" in options:
        args += ["--db", db]
    if "--attn" in options:
        args += ["--attn", r.attention]
    if "--tasks" in options:
        args += ["--tasks", r.task]
    if r.seed is not None and "--seed" in options:
        args += ["--seed", str(r.seed)]
    return args, recorded


def describe(suite: str, row: str, *, options: set[str], db: Optional[str] = None, setting: Optional[str] = None,
             task: Optional[str] = None, committed: bool = True) -> list[str]:
    """The lines ``attnbench show`` prints (see the module docstring); an unknown row is an error naming what the
    tables have. ``options``: the option names ``attnbench run SUITE`` takes (the CLI knows them)."""

    rows = find_rows(suite, row, db=db, setting=setting, task=task, committed=committed)
    if not rows:
        have = sorted({f"{r.attention} ({r.task})" for s in load_sources(suite, db=db, include_committed=committed,
                                                                            setting=setting) for r in s.records})
        hint = ("; rows: " + ", ".join(have[:20]) + (" ..." if len(have) > 20 else "")) if have else \
            f"; no {suite} results in the store or the committed results"
        raise AttnbenchError(f"no {suite} row {row!r}" + (f" of task {task}" if task else "")
                             + (f" in setting {setting}" if setting else "") + hint)
    store = open_existing(db)
    lines = []
    try:
        for row_ in rows:
            first = row_.records[-1]
            seeds = [r.seed for r in row_.records]
            ident = {k: first.params[k] for k in ("preset", "identity", "cell_hash", "vision_identity")
                     if k in first.params}
            lines.append(f"{suite} · {first.setting} · {first.task} · {first.attention} — {len(seeds)} seed(s) "
                         f"{seeds}; {row_.source}")
            lines.append(f"  options {first.options or '{}'}; preset {ident or '(none recorded)'}; dtype "
                         f"{first.dtype}; device {first.device}")
            for r in row_.records:
                run = store.run(r.run_id) if store is not None and r.run_id and not row_.committed else None
                argv = None
                if run and run.get("argv"):
                    import json

                    argv = json.loads(run["argv"]) if isinstance(run["argv"], str) else run["argv"]
                args, recorded = command(r, argv=argv, db=None if row_.committed else db, options=options)
                commit = r.git_commit or "unknown"
                dirty = " (the tree had uncommitted changes: they are not part of that commit)" if r.git_dirty else ""
                lines.append(f"  seed {r.seed}: cell {r.config_hash}, status {r.status}, commit {commit[:12]}{dirty}"
                             + ("" if recorded else "; command rebuilt from the record (no recorded command line)"))
                if r.git_commit:
                    lines.append(f"    git checkout {r.git_commit}")
                lines.append(f"    {shlex.join(args)}")
    finally:
        if store is not None:
            store.close()
    return lines
