"""A folder of wheels that installs attnbench with no network: on a GPU node whose image already has Python, torch
and Triton (CUDA), ``pip install --no-index --find-links DIR 'attnbench[gpu,lm]'``.

pip does all the resolving and downloading; this module builds its command lines and leaves out what the image has:

1. ``pip wheel --no-deps`` builds attnbench's own wheel from its source tree;
2. ``pip install --dry-run --report`` resolves ``attnbench[extras]`` for the node's Python and platform
   (``--only-binary=:all: --python-version --platform --implementation cp``);
3. from pip's report, the packages reachable from attnbench without passing through a :data:`PROVIDED` package
   are kept: torch, triton and nvidia-* are left out, and so is everything that only they need (what both torch
   and attnbench need, e.g. jinja2, stays: the node's copy may be too old for us);
4. ``pip download --no-deps`` fetches exactly those versions; a manifest is written and the total checked.

Two gaps of pip are closed here. pip evaluates the requirements' environment markers for the Python that runs it,
not for ``--python-version``: the graph of step 3 is walked with the node's markers, and a dependency the node needs
but pip did not resolve is added to the requirements and resolved again. And a package published only as a source
archive (lm-eval's sqlitedict and word2number, and rouge-score's newest) has no wheel for ``--only-binary``: it is
built here with ``pip wheel``, kept only if the wheel is pure Python (``py3-none-any``, valid on any platform), and
offered to the resolution through ``--find-links``.

``--torch 2.11`` adds the node's torch to the resolution, so no dependency that needs a newer torch is chosen.
``--have node.txt`` (``python -m pip list --format=freeze`` run on the node) leaves out, besides, every package the
node already has at a version its requirement accepts: on an image with the scientific stack the bundle is then
attnbench, FLA and the few packages the image lacks.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from attnbench.core.errors import AttnbenchError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# What a CUDA image with torch and Triton already has (canonical names, fnmatch patterns).
PROVIDED = ("torch", "triton", "nvidia-*")
LIMIT_MIB = 60.0  # the limit of issue 35 (install on a GPU node with no network)
MANIFEST = "manifest.json"
MiB = 1024 * 1024
PROJECT = Path(__file__).resolve().parents[2]  # the source tree of an editable install

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class BundleError(AttnbenchError):
    """A bad request (option, extra, output folder); the message is one line: what was wrong and what to do."""


class BuildError(BundleError):
    """A request that was fine but failed: pip could not build, resolve or download, or the bundle is too big."""


def _run(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True)


# --- the target: the node's Python and platform ---------------------------------------------------------------------

_PLATFORM = re.compile(r"(?:manylinux_2_(?P<glibc>\d+)|(?P<legacy>manylinux1|manylinux2010|manylinux2014)"
                       r"|musllinux_1_(?P<musl>\d+))_(?P<arch>[a-z0-9_]+)")
_LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}  # their glibc 2.x


@dataclasses.dataclass(frozen=True)
class Target:
    """The interpreter and platform the wheels are for; ``platform`` None is this machine's."""

    python: str                     # "3.12"
    platform: Optional[str] = None  # a Linux wheel platform tag, e.g. manylinux_2_28_x86_64

    @property
    def label(self) -> str:
        if self.platform:
            return self.platform
        tags = [t.platform for t in sys_tags()]  # packaging lists the local linux_* tag first: name the manylinux one
        return f"this machine ({next((t for t in tags if not t.startswith('linux_')), tags[0])})"

    def platforms(self) -> list[str]:
        """The tags pip must accept for ``platform``: pip takes ``--platform`` literally, so a glibc 2.28 node's
        manylinux_2_28 also lists 2_27 ... 2_5 and the legacy names (many wheels are tagged manylinux2014 only)."""
        if self.platform is None:
            return []
        m = _PLATFORM.fullmatch(self.platform)
        arch = m["arch"]
        if m["musl"]:
            return [f"musllinux_1_{k}_{arch}" for k in range(int(m["musl"]), 0, -1)]
        glibc = int(m["glibc"]) if m["glibc"] else _LEGACY[m["legacy"]]
        return ([f"manylinux_2_{k}_{arch}" for k in range(glibc, 4, -1)]
                + [f"{name}_{arch}" for name, k in _LEGACY.items() if k <= glibc])

    def pip_options(self) -> list[str]:
        """pip's options for a foreign interpreter: wheels only, CPython of this version on these platforms."""
        out = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for p in self.platforms():
            out += ["--platform", p]
        return out

    def environment(self) -> dict[str, str]:
        """The node's environment markers (pip evaluates them for the interpreter that runs it instead)."""
        env = dict(default_environment())
        if self.python != ".".join(map(str, sys.version_info[:2])):
            env.update(python_version=self.python, python_full_version=f"{self.python}.0",
                       implementation_version=f"{self.python}.0")
        if self.platform is not None:
            env.update(os_name="posix", sys_platform="linux", platform_system="Linux",
                       platform_machine=_PLATFORM.fullmatch(self.platform)["arch"], platform_release="",
                       platform_version="")
        return env


def target(python: Optional[str] = None, platform: Optional[str] = None, project: Optional[Path] = None) -> Target:
    """The :class:`Target` of ``--python`` and ``--platform`` (None: this machine's), checked."""
    python = (python or ".".join(map(str, sys.version_info[:2]))).strip()
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise BundleError(f"--python must be a Python version like 3.12 (major.minor), got {python!r}")
    needs = _pyproject(project or PROJECT).get("requires-python")
    if needs and not SpecifierSet(needs).contains(f"{python}.0"):
        raise BundleError(f"--python {python}: attnbench needs Python {needs}; give the node's version, e.g. 3.12")
    platform = (platform or "").strip() or None
    if platform is not None and not _PLATFORM.fullmatch(platform):
        raise BundleError(f"--platform must be a Linux wheel platform tag such as manylinux_2_28_x86_64 "
                          f"(`pip debug --verbose` on the node lists its tags), got {platform!r}")
    return Target(python, platform)


# --- the project: its extras and its wheel --------------------------------------------------------------------------


def _pyproject(project: Path = PROJECT) -> dict:
    path = project / "pyproject.toml"
    if not path.is_file():
        return {}
    return tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})


def extras(text: Optional[str], project: Path = PROJECT) -> list[str]:
    """The extras of ``--extras a,b`` (deduplicated, in order), each one attnbench declares."""
    known = list(_pyproject(project).get("optional-dependencies", {}))
    out: list[str] = []
    for e in (p.strip() for p in (text or "").split(",")):
        if e and e not in out:
            if e not in known:
                raise BundleError(f"unknown extra {e!r}: attnbench's extras are {', '.join(known)}")
            out.append(e)
    return out


def requirement(chosen: Sequence[str]) -> str:
    """``attnbench`` or ``attnbench[gpu,lm]``."""
    return "attnbench" + (f"[{','.join(chosen)}]" if chosen else "")


# --- pip's command lines --------------------------------------------------------------------------------------------


def pip() -> list[str]:
    return [sys.executable, "-m", "pip"]


def wheel_command(source: Path, dest: Path) -> list[str]:
    """attnbench's own wheel, built from its source tree (its dependencies come from the resolution)."""
    return [*pip(), "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(source)]


def source_wheel_command(spec: str, dest: Path) -> list[str]:
    """A wheel of ``spec`` for this machine: downloaded if the index has one, else built from its source archive."""
    return [*pip(), "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), spec]


def resolve_command(tgt: Target, requirements: Sequence[str], report: Path, scratch: Path,
                    find_links: Sequence[Path] = ()) -> list[str]:
    """pip's resolution of ``requirements`` for ``tgt``, written as a JSON report and installed nowhere
    (``--target`` because older pip, e.g. 23.2, refuses ``--platform`` without it, even with ``--dry-run``). Not
    quiet: only then does pip's error list the packages it found no wheel of."""
    links = [a for d in find_links for a in ("--find-links", str(d))]
    return [*pip(), "install", "--dry-run", "--ignore-installed", "--report", str(report),
            "--target", str(scratch), *tgt.pip_options(), *links, *requirements]


def local_resolve_command(requirements: Sequence[str], report: Path, scratch: Path,
                          find_links: Sequence[Path] = ()) -> list[str]:
    """The same resolution for this machine, source archives allowed, as a networked ``pip install`` does it: it
    shows which packages pip would build from source."""
    links = [a for d in find_links for a in ("--find-links", str(d))]
    return [*pip(), "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "--target", str(scratch), *links, *requirements]


def download_command(tgt: Target, pins: Sequence[str], dest: Path, find_links: Sequence[Path] = ()) -> list[str]:
    """The wheels of exactly the pinned versions for ``tgt`` (no resolution: the report's versions)."""
    links = [a for d in find_links for a in ("--find-links", str(d))]
    return [*pip(), "download", "--no-deps", "--quiet", "--dest", str(dest), *tgt.pip_options(), *links, *pins]


def install_line(out: str, chosen: Sequence[str]) -> str:
    """The one command for the node."""
    return f"pip install --no-index --find-links {shlex.quote(out)} {shlex.quote(requirement(chosen))}"


# --- what the node needs, from pip's report -------------------------------------------------------------------------


def read_have(path: Optional[str]) -> dict[str, Optional[str]]:
    """The node's installed distributions from ``pip list --format=freeze`` (or ``pip freeze``) run on it: canonical
    name -> version (None where a line names no version: present, version unknown, taken as sufficient)."""
    if path is None:
        return {}
    p = Path(path).expanduser()
    if not p.is_file():
        raise BundleError(f"--have {path}: no such file; on the node run `python -m pip list --format=freeze > "
                          f"node.txt` and copy it here")
    have: dict[str, Optional[str]] = {}
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        name = name.split(" @ ", 1)[0].strip()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise BundleError(f"--have {path}, line {n}: {line!r} is not NAME==VERSION (pip list --format=freeze)")
        have[canonicalize_name(name)] = version.strip() or None
    return have


def provided(name: str, patterns: Iterable[str] = PROVIDED) -> bool:
    name = canonicalize_name(name)
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclasses.dataclass
class Needed:
    keep: dict[str, str]        # canonical name -> version: what the bundle must hold (attnbench included)
    left_out: dict[str, str]    # resolved by pip, but provided or needed only by what is provided
    missing: list[str]          # requirements the node needs that pip's resolution lacks (or has at another version)


def needed(report: dict, tgt: Target, chosen: Sequence[str], root: str = "attnbench",
           patterns: Iterable[str] = PROVIDED, have: Optional[dict[str, Optional[str]]] = None) -> Needed:
    """Walk pip's report from ``root[chosen]`` with the node's markers, stopping at the provided packages and at
    those ``have`` (the node's installed distributions) holds at a version the requirement accepts."""
    have = have or {}
    patterns = tuple(patterns)
    items = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    env = tgt.environment()
    keep: dict[str, str] = {}
    missing: dict[str, str] = {}
    seen: set[tuple[str, frozenset]] = set()
    todo = [(canonicalize_name(root), frozenset(chosen))]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        meta = items[name]
        keep[name] = meta["version"]
        for spec in meta.get("requires_dist") or []:
            req = Requirement(spec)
            # an extra's requirement carries `extra == "x"`: evaluate once per chosen extra ("" for none)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in extra or {""}):
                continue
            dep = canonicalize_name(req.name)
            if provided(dep, patterns):
                continue
            if dep in have and (have[dep] is None or req.specifier.contains(have[dep], prereleases=True)):
                continue  # the node has it at a version this requirement accepts
            if dep not in items or not req.specifier.contains(items[dep]["version"], prereleases=True):
                req.marker = None
                missing[dep] = str(req)
                continue
            todo.append((dep, frozenset(req.extras)))
    left_out = {n: m["version"] for n, m in items.items() if n not in keep}
    return Needed(keep, left_out, [missing[k] for k in sorted(missing)])


# --- pip's errors, as one line --------------------------------------------------------------------------------------

_NO_MATCH = re.compile(r"No matching distribution found for ([^\s;]+)")


def unavailable(output: str) -> list[str]:
    """The requirements pip found no distribution for, from its error output (two phrasings: a plain miss, and a
    miss found while backtracking, listed under 'no matching distributions available for your environment')."""
    out = _NO_MATCH.findall(output)
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "no matching distributions available for your environment" in line:
            for follow in lines[i + 1:]:
                if not follow.startswith((" ", "\t")) or not follow.strip():
                    break
                out.append(follow.strip())
    return list(dict.fromkeys(out))


def from_source(report: dict) -> list[str]:
    """``name==version`` of the packages a report installs from a source archive rather than a wheel."""
    return [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report["install"]
            if not i["download_info"]["url"].endswith(".whl")]


def pip_error(output: str) -> str:
    """The line of pip's output that says what failed (its last ``ERROR:`` line that is not a pointer to docs)."""
    errors = [line[len("ERROR:"):].strip() for line in output.splitlines() if line.startswith("ERROR:")]
    useful = [e for e in errors if "for help visit" not in e and "ResolutionImpossible" not in e]
    return (useful or errors or [(output.strip().splitlines() or ["(no output)"])[-1]])[-1]


# --- the bundle -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Bundle:
    out: Path
    manifest: dict

    @property
    def total_mib(self) -> float:
        return self.manifest["total_bytes"] / MiB

    def lines(self) -> list[str]:
        m = self.manifest
        big = ", ".join(f"{w['file'].split('-')[0]} {w['bytes'] / MiB:.1f}" for w in largest(m["wheels"], 5))
        return [(f"{len(m['wheels'])} wheels, {self.total_mib:.1f} MiB (limit {m['limit_mib']:g} MiB), for Python "
                 f"{m['python']} on {m['platform']}, in {self.out} (list: {MANIFEST})"),
                f"largest (MiB): {big}",
                (f"left out, as the node's image has them: {len(m['left_out'])} packages "
                 f"({', '.join(m['provided'])}" + (f", what {m['have']} lists at an accepted version" if m.get("have")
                                                   else "") + " and what only they need)"),
                f"on the node: {m['install']}"]


def largest(wheels: Sequence[dict], n: int) -> list[dict]:
    return sorted(wheels, key=lambda w: -w["bytes"])[:n]


def check_size(wheels: Sequence[dict], limit_mib: float) -> None:
    """Fail, naming the largest wheels, when the bundle is over ``limit_mib``."""
    total = sum(w["bytes"] for w in wheels)
    if total > limit_mib * MiB:
        big = ", ".join(f"{w['file'].split('-')[0]} {w['bytes'] / MiB:.1f}" for w in largest(wheels, 4))
        raise BuildError(f"the bundle is {total / MiB:.1f} MiB, over the {limit_mib:g} MiB limit (largest, MiB: "
                         f"{big}): choose fewer --extras, or raise --max-mib")


def manifest(folder: Path, *, command: str, tgt: Target, chosen: Sequence[str], out: str, need: Needed,
             built: Sequence[str], limit_mib: float, torch: Optional[str] = None, have: Optional[str] = None) -> dict:
    """The manifest of the wheels in ``folder``: how they were made, for what, each with its size."""
    wheels = [{"file": p.name, "bytes": p.stat().st_size} for p in sorted(folder.glob("*.whl"))]
    total = sum(w["bytes"] for w in wheels)
    return {"command": command,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": tgt.python, "platform": tgt.label, "extras": list(chosen), "torch": torch,
            "install": install_line(out, chosen),
            "provided": list(PROVIDED), "have": have, "left_out": sorted(f"{n}=={v}" for n, v in need.left_out.items()),
            "built_from_source": list(built),
            "wheels": wheels, "total_bytes": total, "total_mib": round(total / MiB, 2), "limit_mib": limit_mib}


def _check(proc: "subprocess.CompletedProcess[str]", what: str) -> None:
    if proc.returncode != 0:
        raise BuildError(f"{what}: {pip_error(proc.stdout + proc.stderr)}")


def _pure_wheel(spec: str, dest: Path, tgt: Target, run: Runner) -> tuple[str, bool]:
    """This machine's wheel of ``spec`` (fetched, or built from its source archive) and whether it is pure Python,
    so valid on the node too (a wheel that is not is removed)."""
    before = set(dest.glob("*.whl"))
    _check(run(source_wheel_command(spec, dest)), f"no wheel of {spec} for Python {tgt.python} on {tgt.label}, "
           f"and pip could not build one")
    made = sorted(set(dest.glob("*.whl")) - before)
    if len(made) != 1:
        raise BuildError(f"pip wheel {spec} made {len(made)} wheels, not one")
    pure = all(t.abi == "none" and t.platform == "any" for t in parse_wheel_filename(made[0].name)[3])
    if not pure:
        made[0].unlink()
    return made[0].name, pure


def _names(specs: Iterable[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        try:
            out.setdefault(canonicalize_name(Requirement(spec).name), spec)
        except InvalidRequirement:
            continue
    return out


def resolve(tgt: Target, requirements: list[str], work: Path, built: Path, run: Runner,
            progress: Callable[[str], None], what: str, rounds: int = 4) -> tuple[dict, list[str]]:
    """pip's report of ``requirements`` for ``tgt``, after a wheel is built here for each package published only
    as a source archive (pure Python only: a compiled one is left to pip, which may find an older wheel).

    Which those are: the ones a resolution for this machine, source archives allowed, takes from an sdist (so the
    node gets the versions a networked ``pip install`` would), and any that the target's resolution then names as
    having no distribution. Returns the report and the wheels built."""
    made: list[str] = []
    impure: dict[str, str] = {}  # name -> the platform wheel built here
    report, scratch = work / "report.json", work / "never-installed"
    local = run(local_resolve_command(requirements, report, scratch, [built]))
    # (this machine may not resolve what the node does, e.g. another Python: then only pip's errors tell)
    todo = _names(from_source(json.loads(report.read_text(encoding="utf-8")))) if local.returncode == 0 else {}
    tried: set[str] = set()
    for _ in range(rounds):
        for name, spec in todo.items():
            tried.add(name)
            progress(f"{spec} is published only as a source archive: building its wheel here")
            try:
                wheel, pure = _pure_wheel(spec, built, tgt, run)
            except BuildError as e:  # e.g. a compiler missing here: pip may still find a wheel of another version
                wheel, pure = str(e), False
            if pure:
                made.append(wheel)
            else:
                impure[name] = wheel
                progress(f"{spec} is not pure Python ({wheel}): left to pip (an older wheel, if any)")
        proc = run(resolve_command(tgt, requirements, report, scratch, [built]))
        if proc.returncode == 0:
            return json.loads(report.read_text(encoding="utf-8")), made
        output = proc.stdout + proc.stderr
        named = _names(unavailable(output))
        for name, spec in named.items():
            if name in impure:
                raise BuildError(f"no wheel of {spec} for Python {tgt.python} on {tgt.label}, and it is not pure "
                                 f"Python (built here: {impure[name]}): choose another --python/--platform, or "
                                 f"fewer --extras")
        todo = {n: s for n, s in named.items() if n not in tried and not provided(n)}
        if not todo and named:
            raise BuildError(f"pip found no wheel of {', '.join(named.values())} for Python {tgt.python} on "
                             f"{tgt.label} (resolving {what}): check --python and --platform against the node")
        if not todo:
            raise BuildError(f"pip could not resolve {what} for Python {tgt.python} on {tgt.label}: "
                             f"{pip_error(output)}")
    raise BuildError(f"pip could not resolve {what} for Python {tgt.python} on {tgt.label}: still failing after "
                     f"{rounds} rounds of building missing wheels")


def build(out: str, *, python: Optional[str] = None, platform: Optional[str] = None,
          extras_text: Optional[str] = None, torch: Optional[str] = None, have_file: Optional[str] = None,
          limit_mib: float = LIMIT_MIB,
          command: str = "", project: Path = PROJECT, run: Optional[Runner] = None,
          progress: Callable[[str], None] = lambda line: None) -> Bundle:
    """Build the bundle in the new folder ``out`` (see the module's docstring); nothing is left there on failure."""
    run = run or _run
    tgt = target(python, platform, project)
    chosen = extras(extras_text, project)
    have = read_have(have_file)
    if limit_mib <= 0:
        raise BundleError(f"--max-mib must be a size in MiB > 0, got {limit_mib:g}")
    if torch is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", torch.strip()):
        raise BundleError(f"--torch must be the node's torch version like 2.11, got {torch!r}")
    if not (project / "pyproject.toml").is_file() or _pyproject(project).get("name") != "attnbench":
        raise BundleError(f"the bundle builds attnbench's wheel from its source tree, which is not at {project} "
                          f"(an install from a wheel): run it from a clone installed with `pip install -e .`")
    dest = Path(out).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BundleError(f"--out {out} exists and is not an empty folder: give a new folder (the bundle is the "
                          f"whole folder)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="attnbench-bundle-") as tmp:
            work = Path(tmp)
            own, built = work / "own", work / "built"
            built.mkdir()
            progress(f"building attnbench's wheel from {project}")
            _check(run(wheel_command(project, own)), f"pip could not build attnbench's wheel from {project}")
            wheel = next(own.glob("attnbench-*.whl"), None)
            if wheel is None:
                raise BuildError(f"pip wheel wrote no attnbench wheel from {project}")
            root = f"{requirement(chosen)} @ {wheel.as_uri()}"
            requirements = [root] + ([f"torch=={torch.strip()}.*"] if torch else [])
            progress(f"resolving {requirement(chosen)} for Python {tgt.python} on {tgt.label} (pip)")
            report, made = resolve(tgt, requirements, work, built, run, progress, requirement(chosen))
            need = needed(report, tgt, chosen, have=have)
            if need.missing:  # needed on the node's Python, not on this one: resolve them too
                progress(f"the node's markers need {', '.join(need.missing)} too: resolving again")
                report, more = resolve(tgt, requirements + need.missing, work, built, run, progress,
                                       requirement(chosen))
                made += more
                need = needed(report, tgt, chosen, have=have)
                if need.missing:
                    raise BuildError(f"pip's resolution for Python {tgt.python} lacks {', '.join(need.missing)}, "
                                     f"which the node's markers need: run the bundle with that Python")
            pins = [f"{n}=={v}" for n, v in sorted(need.keep.items()) if n != "attnbench"]
            progress(f"downloading {len(pins)} wheels (pip)")
            shutil.copy2(wheel, staging / wheel.name)
            if pins:
                _check(run(download_command(tgt, pins, staging, [built])),
                       f"pip could not download the wheels for Python {tgt.python} on {tgt.label}")
            info = manifest(staging, command=command, tgt=tgt, chosen=chosen, out=out, need=need, built=made,
                            limit_mib=limit_mib, torch=torch, have=have_file)
            check_size(info["wheels"], limit_mib)
            (staging / MANIFEST).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        if dest.exists():
            dest.rmdir()
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return Bundle(dest, info)
