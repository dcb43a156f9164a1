#!/usr/bin/env python3
"""The GPU campaign: on a node with no network, install attnbench from carried wheels and run its doctor.

Standard library only: it runs before attnbench is installed, under the node's own Python (the one holding torch).

    python3 scripts/gpu_campaign.py run --wheels DIR_OR_ARCHIVE... --out OUT [--budget 6] [--timeout 540]
                                        [--env DIR] [-- DOCTOR OPTIONS...]
    python3 scripts/gpu_campaign.py step --wheels DIR_OR_ARCHIVE... --out OUT [--timeout 240] [--env DIR]
                                         [-- BENCH_TRAIN_STEP OPTIONS...]
    python3 scripts/gpu_campaign.py pack --out wheels.tar.xz DIR_OR_WHEEL...

``run``, in order, everything it prints also in OUT/campaign.log:

1. the node: ``pip list --format=freeze`` into OUT/node.txt (what ``attnbench bundle --have`` reads), the GPU;
2. an overlay environment (``--env``, default a temporary folder; an overlay an earlier campaign made there is used
   again): a venv without pip whose one ``.pth`` adds the node's site-packages with ``site.addsitedir``. The node's
   packages are seen there and never changed;
3. the carried wheels installed into it as they are (``--no-index --no-deps``: the bundle was resolved against the
   node by ``attnbench bundle --have node.txt``, and pip's resolver is kept out, so that a requirement the image
   itself leaves unmet cannot stop the run). A carried wheel of the node's GPU stack (torch, Triton, CUDA libraries,
   NumPy) at another version stops the campaign before anything is installed; a carried wheel of another package
   the node has at another version is installed into the overlay and said (``shadowed``); ``pip check`` is logged;
4. ``attnbench doctor --budget BUDGET --db OUT/store.db --out OUT`` and the options after ``--``; at ``--timeout``
   seconds it gets SIGTERM (it keeps its finished steps and writes doctor.md), 60 s later SIGKILL;
5. the doctor's records to OUT/doctor.jsonl and the smokes' (OUT/smokes.db) to OUT/smokes.jsonl.

``step`` does 1-3 alike, then in place of 4-5 runs ``benchmarks/bench_train_step.py`` (beside this script's folder)
with the options after ``--``, its output also in OUT/train-step.txt: the small models' training step, eager and
compiled, in one run (issue 47's GPU measurement).

Exit code: the doctor's or the benchmark's (0 ok, 1 a failure; stopped at the timeout: the doctor 130, the benchmark
143; 137 for either when SIGKILL had to follow); 2 when the campaign itself could not go on (bad option, no
attnbench wheel, a wheel that would replace the node's GPU stack, a failed install), with one line saying why.

``pack`` writes the wheels as one xz archive of their unpacked files, which ``run --wheels`` takes as it takes a
folder: for a transfer with a size limit, a compiled wheel's files often shrink to half in xz (zip's deflate
compresses file by file); the wheels are zipped again on the node, byte for byte the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Optional, Sequence, TextIO

STOP_GRACE_S = 60.0  # after SIGTERM, the doctor writes its summary; then it is killed
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_train_step.py"   # what `step` runs


class CampaignError(Exception):
    """The campaign cannot go on; the message is one line: what was wrong and what to do."""


# --- wheels: folders, files and packed archives ----------------------------------------------------------------------

def canonical(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(wheel: str) -> str:
    """A wheel file's (or a .dist-info folder's) distribution name, canonical."""
    return canonical(wheel.split("-", 1)[0])


def pack(srcs: Sequence[str], out: str) -> tuple[int, int]:
    """Every wheel of ``srcs`` (wheel files, folders of them) unpacked into one xz archive, each under a folder
    named as its file; returns (wheels, archive bytes)."""
    wheels = gather_wheel_files(srcs)
    if not wheels:
        raise CampaignError(f"pack: no .whl among {', '.join(srcs)}")
    target = Path(out)
    if not target.name.endswith(".tar.xz"):
        raise CampaignError(f"pack --out must name a .tar.xz file, got {out}")
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=9) as tar:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    member = tarfile.TarInfo(f"{wheel.name}/{info.filename}")
                    member.size, member.mode, member.mtime = info.file_size, 0o644, 0
                    with z.open(info) as f:
                        tar.addfile(member, f)
    os.replace(partial, target)
    return len(wheels), target.stat().st_size


def unpack(archive: Path, dest: Path) -> list[Path]:
    """The wheels of a :func:`pack` archive, zipped again into ``dest``."""
    made: dict[str, zipfile.ZipFile] = {}
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar:
                wheel, _, inner = member.name.partition("/")
                if not member.isfile() or not wheel.endswith(".whl") or not inner or ".." in inner.split("/"):
                    raise CampaignError(f"{archive}: {member.name!r} is not a packed wheel's file (make the "
                                        f"archive with `gpu_campaign.py pack`)")
                if wheel not in made:
                    made[wheel] = zipfile.ZipFile(dest / wheel, "w", zipfile.ZIP_STORED)
                made[wheel].writestr(zipfile.ZipInfo(inner, date_time=(1980, 1, 1, 0, 0, 0)),
                                     tar.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError) as e:
        raise CampaignError(f"{archive}: not a readable .tar.xz of wheels ({e})") from e
    finally:
        for z in made.values():
            z.close()
    return [dest / w for w in made]


def sources(src: str) -> tuple[list[Path], list[Path]]:
    """The loose wheels and the packed archives one ``--wheels`` argument names."""
    p = Path(src)
    if p.name.endswith(".tar.xz") and p.is_file():
        return [], [p]
    if p.is_dir():
        return sorted(p.glob("*.whl")), sorted(p.glob("*.tar.xz"))
    if p.suffix == ".whl" and p.is_file():
        return [p], []
    raise CampaignError(f"{src}: not a folder, a .whl or a .tar.xz of packed wheels" if p.exists() else
                        f"{src}: no such file or folder")


def gather_wheel_files(srcs: Sequence[str]) -> list[Path]:
    return [w for src in srcs for w in sources(src)[0]]


def gather(srcs: Sequence[str], dest: Path) -> list[Path]:
    """All carried wheels in one folder (``dest``): copies of loose ones, packed archives zipped again."""
    wheels: list[Path] = []
    for src in srcs:
        loose, archives = sources(src)
        for w in loose:
            shutil.copyfile(w, dest / w.name)
            wheels.append(dest / w.name)
        for a in archives:
            wheels += unpack(a, dest)
    names = [dist_name(w.name) for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CampaignError(f"two wheels of {', '.join(twice)} among --wheels: keep one of each")
    if "attnbench" not in names:
        raise CampaignError(f"no attnbench wheel among the {len(wheels)} carried wheels: build the bundle with "
                            f"`attnbench bundle --out DIR ...` and pass that folder to --wheels")
    return sorted(wheels)


# --- the node and the overlay environment ---------------------------------------------------------------------------

# The node's GPU stack, which no carried wheel may replace: a wrong torch, Triton, CUDA library or NumPy ABI breaks
# the image's compiled packages.
PINNED = ("torch", "torchvision", "torchaudio", "triton", "nvidia-*", "cuda-*", "numpy")


def node_versions(freeze: str) -> dict[str, str]:
    """The node's ``pip list --format=freeze``: normalised name -> version."""
    pairs = (line.strip().partition("==") for line in freeze.splitlines())
    return {canonical(n): v for n, sep, v in pairs if sep and " @ " not in n}


def replaces_gpu_stack(wheels: Sequence[Path], node: dict[str, str]) -> list[str]:
    """``name carried-version (node: version)`` for each carried wheel of the node's GPU stack at another version."""
    out = []
    for w in wheels:
        name, version = dist_name(w.name), w.name.split("-")[1]
        if any(fnmatch.fnmatchcase(name, p) for p in PINNED) and name in node and node[name] != version:
            out.append(f"{name} {version} (node: {node[name]})")
    return out


def shadowed(node: dict[str, str], site_dir: Path) -> list[str]:
    """``name node-version -> overlay-version`` for each package the overlay installed that the node also has at
    another version (the node's copy is untouched but no longer imported), attnbench's own left out."""
    out = []
    for meta in sorted(site_dir.glob("*.dist-info")):
        name, _, version = meta.name[:-len(".dist-info")].partition("-")
        name = dist_name(name)
        if name in node and name != "attnbench" and node[name] != version:
            out.append(f"{name} {node[name]} -> {version}")
    return out


NODE_PTH = "_node_site.pth"   # the overlay's one .pth: the node's site-packages


def overlay(node_python: str, env: Path, log) -> tuple[Path, Path]:
    """A venv at ``env`` that sees the node's site-packages (through their own .pth files too): its python and its
    own site-packages."""
    probe = ("import json, site, sys; print(json.dumps([sys.version_info[:2], "
             "site.getsitepackages() + [site.getusersitepackages()]]))")
    version, dirs = json.loads(run_ok([node_python, "-c", probe], "the node's Python", log))
    site_dir = env / "lib" / f"python{version[0]}.{version[1]}" / "site-packages"
    if (site_dir / NODE_PTH).is_file():
        log(f"campaign: the overlay at {env} is used again")
        return env / "bin" / "python", site_dir
    if env.exists() and any(env.iterdir()):
        raise CampaignError(f"--env {env} exists, is not empty and is not a campaign's overlay: give a new folder")
    run_ok([node_python, "-m", "venv", "--without-pip", str(env)], "making the overlay venv", log)
    dirs = [d for d in dirs if Path(d).is_dir()]
    (site_dir / NODE_PTH).write_text(
        "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
    return env / "bin" / "python", site_dir


# --- processes, logged ----------------------------------------------------------------------------------------------

class Log:
    """Everything printed goes to stdout and the campaign's log file."""

    def __init__(self, path: Path):
        self.file: TextIO = path.open("a", encoding="utf-8")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_ok(argv: Sequence[str], what: str, log: Log, env: Optional[dict] = None) -> str:
    """Run a short command; its output to the log; one line (its last line of error) if it fails."""
    log(f"$ {shlex.join(map(str, argv))}")
    r = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env)
    for line in (r.stdout + r.stderr).splitlines():
        log.file.write(f"  {line}\n")
    if r.returncode != 0:
        raise CampaignError(f"{what} failed (exit {r.returncode}): {why(r.stdout + r.stderr)} (the log has the "
                            f"rest)")
    return r.stdout


def why(output: str) -> str:
    """The line of a failed command's output that says what failed: pip's conflict or missing version if it names
    one, else its last error line, else the last line."""
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    for key in ("Cannot install", "Could not find a version", "No matching distribution"):
        named = [x for x in lines if key in x]
        if named:
            return named[-1]
    errors = [x for x in lines if x.startswith("ERROR") and "for help visit" not in x]
    return (errors or lines or ["(no output)"])[-1]


def stream(name: str, argv: Sequence[str], log: Log, timeout_s: Optional[float], env: dict,
           copy: Optional[Path] = None) -> int:
    """Run the job ``name``, its output line by line into the log (and ``copy``); SIGTERM at ``timeout_s``, SIGKILL
    after the grace."""
    log(f"$ {shlex.join(map(str, argv))}")
    proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    stopped: list[str] = []

    def stop():
        if proc.poll() is None:
            stopped.append("SIGTERM")
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                stopped.append("SIGKILL")
                os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, stop) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    with (copy.open("w", encoding="utf-8") if copy else contextlib.nullcontext()) as f:
        for line in proc.stdout:
            log(line.rstrip("\n"))
            if f:
                f.write(line)
                f.flush()
    code = proc.wait()
    code = 128 - code if code < 0 else code       # killed by a signal: the shell's 128 + N
    if timer:
        timer.cancel()
    if stopped:
        log(f"campaign: {name} was stopped at --timeout {timeout_s:g} s ({' then '.join(stopped)})")
    return code


# --- the campaign ---------------------------------------------------------------------------------------------------

def campaign(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "campaign.log")
    t0 = time.monotonic()
    try:
        log(f"campaign: {time.strftime('%Y-%m-%d %H:%M:%S %Z')} · python {args.python} · out {out}")
        freeze = run_ok([args.python, "-m", "pip", "list", "--format=freeze"], "listing the node's packages", log)
        (out / "node.txt").write_text(freeze)
        try:
            gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            gpu = ""
        log(f"gpu: {gpu or 'none found (nvidia-smi)'}")
        with tempfile.TemporaryDirectory(prefix="attnbench-campaign-") as tmp:
            tmp = Path(tmp)
            (tmp / "wheels").mkdir()
            wheels = gather(args.wheels, tmp / "wheels")
            log(f"wheels: {len(wheels)} ({sum(w.stat().st_size for w in wheels) / 2 ** 20:.1f} MiB): "
                + ", ".join(w.name for w in wheels))
            node = node_versions(freeze)
            bad = replaces_gpu_stack(wheels, node)
            if bad:
                raise CampaignError(f"carried wheels would replace the node's GPU stack: {', '.join(bad)}: rebuild "
                                    f"the bundle with --have node.txt (the node's pip list) and leave them out")
            env_dir = Path(args.env) if args.env else tmp / "env"
            py, site_dir = overlay(args.python, env_dir, log)
            # -m from a source checkout would import its attnbench/ (the current folder comes first): never
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}
            pip = [py, "-m", "pip", "--disable-pip-version-check", "--no-input", "install", "--no-index",
                   "--no-deps", "--no-cache-dir"]
            own = [w for w in wheels if dist_name(w.name) == "attnbench"]
            run_ok([*pip, "--ignore-installed", *own], "installing attnbench's wheel", log, env)
            # the bundle was resolved against the node (attnbench bundle --have): install it as it is, pip's
            # resolver kept out of it, so that a requirement the image itself leaves unmet cannot stop the run
            rest = [w for w in wheels if dist_name(w.name) != "attnbench"]
            if rest:
                run_ok([*pip, *rest], "installing the carried wheels", log, env)
            for line in shadowed(node, site_dir):
                log(f"campaign: shadowed: {line} (a carried wheel of another version; the node's copy is left "
                    f"as it was, the overlay's imported)")
            check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True, env=env)
            carried = {dist_name(w.name) for w in wheels}
            for line in check.stdout.splitlines():  # `NAME VERSION requires/has requirement ...`
                if line.startswith("No broken requirements"):
                    continue
                ours = dist_name(line.split(" ", 1)[0]) in carried
                log(f"campaign: pip check: {line}" + ("" if ours else " (the node's own)"))
            log(f"installed in {time.monotonic() - t0:.0f} s")
            if args.command == "step":
                code = stream("bench_train_step", [py, BENCH, *args.rest], log, args.timeout, env,
                              copy=out / "train-step.txt")
                log(f"campaign: bench_train_step exit {code} after {time.monotonic() - t0:.0f} s")
                return code
            attnbench = [py, "-m", "attnbench.cli.main"]
            doctor = [*attnbench, "doctor", "--budget", f"{args.budget:g}", "--db", out / "store.db",
                      "--out", out, *args.rest]
            code = stream("the doctor", doctor, log, args.timeout, env)
            log(f"campaign: doctor exit {code} after {time.monotonic() - t0:.0f} s")
            for db, name, suite in ((out / "store.db", "doctor.jsonl", ["--suite", "doctor"]),
                                    (out / "smokes.db", "smokes.jsonl", [])):
                if db.exists():
                    try:
                        run_ok([*attnbench, "export", "--format", "jsonl", *suite, "--db", db, "--out", out / name],
                               f"exporting {db.name}", log, env)
                    except CampaignError as e:  # the doctor's exit code stays the verdict
                        log(f"campaign: {e}")
            return code
    except CampaignError as e:
        log(f"campaign: error: {e}")
        return 2
    finally:
        log.close()


def parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="gpu_campaign.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="install the carried wheels into an overlay of the node's Python, run the doctor")
    s = sub.add_parser("step", help="install as `run` does, then time the small models' training step "
                                    "(benchmarks/bench_train_step.py, its options after --)")
    for p in (r, s):
        p.add_argument("--wheels", nargs="+", required=True, help="folders of wheels, .whl files, packed .tar.xz")
        p.add_argument("--out", required=True, help="where the log, node.txt and what the job writes go")
        p.add_argument("--python", default=sys.executable, help="the node's Python, which has torch (default: this "
                                                                "one)")
        p.add_argument("--timeout", type=float, default=None, help="seconds after which the job is stopped")
        p.add_argument("--env", default=None, help="the overlay venv's folder (default: temporary; an overlay an "
                                                   "earlier campaign made there is used again)")
    r.add_argument("--budget", type=float, default=6.0, help="the doctor's budget in minutes (default 6)")
    p = sub.add_parser("pack", help="wheels into one .tar.xz of their files (smaller to carry)")
    p.add_argument("sources", nargs="+", help="wheel files or folders of them")
    p.add_argument("--out", required=True, help="the .tar.xz to write")
    args = parser.parse_args(argv)
    args.rest = rest
    if args.command == "run" and args.budget <= 0:
        parser.error("--budget must be positive")
    if args.command in ("run", "step") and args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "pack":
        try:
            n, size = pack(args.sources, args.out)
        except CampaignError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"packed {n} wheels into {args.out} ({size / 2 ** 20:.1f} MiB)")
        return 0
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
