"""``attnbench bundle``: the wheels for a GPU node with no network. pip is replaced by a fake that answers from a
small dependency graph (no network here: CI must not depend on the index); ATTNBENCH_BUNDLE_NETWORK=1 adds one real
build through pip."""

import json
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from attnbench.cli.main import app
from attnbench.engine import bundle

NODE = bundle.Target("3.12", "manylinux_2_28_x86_64")
HERE = ".".join(map(str, sys.version_info[:2]))

# name -> (version, requires_dist, size in bytes of its wheel); what pip's report says of each package
GRAPH = {
    "attnbench": ("0.1.0", ["torch>=2.4", "numpy>=1.24", "jinja2>=3.1", "tomli>=2; python_version < '3.11'",
                            "triton>=3.0; extra == 'gpu'", "flash-linear-attention>=0.6; extra == 'gpu'",
                            "datasets>=2.18; extra == 'lm'", "sqlitedict; extra == 'lm'"], 600_000),
    "torch": ("2.11.0", ["jinja2", "sympy>=1.13", "typing-extensions>=4.10",
                         "nvidia-cublas==13.1; platform_system == 'Linux'",
                         "triton==3.6.0; platform_system == 'Linux'", "setuptools; python_version >= '3.12'"],
              900 << 20),
    "triton": ("3.6.0", [], 200 << 20),
    "nvidia-cublas": ("13.1", [], 500 << 20),
    "sympy": ("1.14.0", ["mpmath>=1.1"], 6 << 20),
    "mpmath": ("1.3.0", [], 500_000),
    "typing-extensions": ("4.16.0", [], 40_000),
    "setuptools": ("81.0.0", [], 1 << 20),
    "jinja2": ("3.1.6", ["MarkupSafe>=2.0"], 130_000),
    "markupsafe": ("3.0.4", [], 20_000),
    "numpy": ("2.4.6", [], 16 << 20),
    "flash-linear-attention": ("0.6.0", ["fla-core==0.6.0", "torch>=2.5"], 380_000),
    "fla-core": ("0.6.0", ["einops", "torch>=2.5", "typing-extensions; python_version < '3.12'"], 1 << 20),
    "einops": ("0.8.2", [], 60_000),
    "datasets": ("5.2.0", ["fsspec[http]<=2026.9", "numpy"], 600_000),
    "fsspec": ("2026.9.0", ["aiohttp; extra == 'http'", "pytest; extra == 'test'"], 210_000),
    "aiohttp": ("3.14.5", [], 1_900_000),
    "sqlitedict": ("2.1.0", [], 20_000),
}
SDIST_ONLY = {"sqlitedict"}


def report(names, graph=GRAPH):
    """pip's ``--report`` of these packages."""
    def url(n, v):
        return f"https://files/{n}-{v}.tar.gz" if n in SDIST_ONLY else f"https://files/{n}-{v}-py3-none-any.whl"
    return {"version": "1", "install": [
        {"metadata": {"name": n, "version": graph[n][0], "requires_dist": graph[n][1]},
         "download_info": {"url": url(n, graph[n][0])}} for n in names]}


ALL = list(GRAPH)
NOT_ON_312 = [n for n in ALL if n != "setuptools"]  # pip on 3.11 evaluates python_version >= '3.12' as false


def arg(argv, option):
    return argv[argv.index(option) + 1]


class FakePip:
    """Answers pip's command lines as pip would for GRAPH, and records them."""

    def __init__(self, resolved=ALL, native=ALL, fail=None, impure=()):
        self.resolved, self.native, self.fail, self.impure = resolved, native, fail, set(impure)
        self.calls = []

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        assert argv[:3] == [sys.executable, "-m", "pip"]
        cmd = argv[3]
        if self.fail and self.fail[0] == cmd and (len(self.fail) < 3 or self.fail[2](argv)):
            return subprocess.CompletedProcess(argv, 1, "", self.fail[1])
        if cmd == "wheel":
            spec, dest = argv[-1], arg(argv, "--wheel-dir")
            os.makedirs(dest, exist_ok=True)
            if spec == str(bundle.PROJECT):
                name = "attnbench-0.1.0-py3-none-any.whl"
            else:
                req = Requirement(spec)
                n, v = req.name, next((s.version for s in req.specifier if s.operator == "=="), "1.0")
                tag = "cp311-cp311-linux_x86_64" if n in self.impure else "py3-none-any"
                name = f"{n}-{v}-{tag}.whl"
            with open(os.path.join(dest, name), "wb") as f:
                f.write(b"w" * 1000)
        elif cmd == "install":
            native = "--python-version" not in argv
            root = next(a for a in argv if a.startswith("attnbench"))
            skip = ({"datasets", "fsspec", "aiohttp", "sqlitedict"} if "lm" not in root else set()) | \
                ({"flash-linear-attention", "fla-core", "einops"} if "gpu" not in root else set())
            names = [n for n in (self.native if native else self.resolved) if n not in skip]
            if not native:
                built = os.listdir(arg(argv, "--find-links"))
                missing = [n for n in SDIST_ONLY if n in names and not any(b.startswith(n + "-") for b in built)]
                if missing:
                    return subprocess.CompletedProcess(argv, 1, "", f"ERROR: No matching distribution found for "
                                                                    f"{missing[0]}\n")
            with open(arg(argv, "--report"), "w") as f:
                json.dump(report(names), f)
        elif cmd == "download":
            dest = arg(argv, "--dest")
            for pin in (a for a in argv if "==" in a):
                n, v = pin.split("==")
                with open(os.path.join(dest, f"{n.replace('-', '_')}-{v}-py3-none-any.whl"), "wb") as f:
                    f.truncate(GRAPH[n][2] if n in GRAPH else 1000)
        return subprocess.CompletedProcess(argv, 0, "", "")

    def of(self, cmd):
        return [c for c in self.calls if c[3] == cmd]


# --- what the node needs ----------------------------------------------------------------------------------------


def test_torch_triton_nvidia_and_what_only_they_need_are_left_out():
    need = bundle.needed(report(NOT_ON_312), bundle.Target(HERE), ["gpu"])
    assert set(need.keep) == {"attnbench", "numpy", "jinja2", "markupsafe", "flash-linear-attention", "fla-core",
                              "einops", "typing-extensions"}  # fla-core needs typing-extensions below 3.12
    for gone in ("torch", "triton", "nvidia-cublas", "sympy", "mpmath"):
        assert gone in need.left_out
    assert need.missing == []


def test_a_package_torch_and_attnbench_both_need_stays():
    """The node's copy of jinja2 came with torch and may be older than ours needs: the bundle carries it."""
    need = bundle.needed(report(NOT_ON_312), bundle.Target(HERE), [])
    assert "jinja2" in need.keep and "markupsafe" in need.keep
    assert set(need.keep) == {"attnbench", "numpy", "jinja2", "markupsafe"}


def test_the_node_markers_decide_not_pips():
    """pip on 3.11 resolves for its own markers: typing-extensions (fla-core's below 3.12) is dropped for a 3.12
    node, and a requirement the 3.12 node has that pip did not resolve is reported missing."""
    need = bundle.needed(report(NOT_ON_312), NODE, ["gpu"])
    assert "typing-extensions" not in need.keep
    assert need.missing == []  # setuptools (python >= 3.12) is torch's alone
    graph = dict(GRAPH, numpy=("2.4.6", ["packaging; python_version >= '3.12'"], 16 << 20))
    need = bundle.needed(report(NOT_ON_312, graph), NODE, [])
    assert need.missing == ["packaging"]


def test_a_dependency_at_a_version_the_node_rejects_is_missing():
    graph = dict(GRAPH, attnbench=("0.1.0", ["numpy>=3"], 1000))
    assert bundle.needed(report(ALL, graph), NODE, []).missing == ["numpy>=3"]


def test_extras_are_followed_only_where_requested():
    need = bundle.needed(report(ALL), NODE, ["lm"])
    assert {"datasets", "fsspec", "aiohttp", "sqlitedict"} <= set(need.keep)  # fsspec[http] brings aiohttp
    assert "flash-linear-attention" not in need.keep and "pytest" not in need.keep


def test_what_the_node_has_at_an_accepted_version_is_left_out(tmp_path):
    """``--have``: the node's ``pip list --format=freeze``; a package it has at a version the requirement accepts is
    left out with what only it needs, one at a version a requirement rejects is carried."""
    node = tmp_path / "node.txt"
    node.write_text("# pip list --format=freeze\nnumpy==2.5.2\nJinja2==3.0.0\ndatasets==5.2.0\nfsspec==2026.9.0\n"
                    "aiohttp\n-e git+https://x#egg=y\n")
    have = bundle.read_have(str(node))
    assert have == {"numpy": "2.5.2", "jinja2": "3.0.0", "datasets": "5.2.0", "fsspec": "2026.9.0", "aiohttp": None}
    need = bundle.needed(report(ALL), NODE, ["lm"], have=have)
    assert "numpy" not in need.keep and "datasets" not in need.keep and "fsspec" not in need.keep
    assert "jinja2" in need.keep  # attnbench asks jinja2>=3.1; the node's 3.0.0 is too old
    assert "sqlitedict" in need.keep and "aiohttp" not in need.keep


def test_a_bad_have_file_is_one_line(tmp_path):
    with pytest.raises(bundle.BundleError, match="--have .*no such file; on the node run"):
        bundle.read_have(str(tmp_path / "nope.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_text("numpy==2.5\nthis is not a requirement\n")
    with pytest.raises(bundle.BundleError, match="line 2: 'this is not a requirement' is not NAME==VERSION"):
        bundle.read_have(str(bad))


# --- pip's command lines --------------------------------------------------------------------------------------------


def test_pip_command_lines_for_the_gpu_node(tmp_path):
    cmd = bundle.resolve_command(NODE, ["attnbench[gpu] @ file:///x.whl"], tmp_path / "r.json", tmp_path / "t",
                                 [tmp_path / "built"])
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    for flag in ("--dry-run", "--ignore-installed", "--only-binary=:all:"):
        assert flag in cmd
    assert arg(cmd, "--python-version") == "3.12" and arg(cmd, "--implementation") == "cp"
    assert arg(cmd, "--report") == str(tmp_path / "r.json") and arg(cmd, "--find-links") == str(tmp_path / "built")
    platforms = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    # pip takes --platform literally: glibc 2.28 accepts every older manylinux wheel
    assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms and "manylinux1_x86_64" in platforms
    assert "manylinux_2_29_x86_64" not in platforms and cmd[-1] == "attnbench[gpu] @ file:///x.whl"
    down = bundle.download_command(NODE, ["numpy==2.4.6"], tmp_path / "out")
    assert down[3] == "download" and "--no-deps" in down and "--only-binary=:all:" in down
    assert arg(down, "--dest") == str(tmp_path / "out") and down[-1] == "numpy==2.4.6"
    assert bundle.wheel_command(bundle.PROJECT, tmp_path)[3:5] == ["wheel", "--no-deps"]


def test_this_machine_is_the_default():
    tgt = bundle.target()
    assert tgt.python == HERE and tgt.platforms() == []
    opts = tgt.pip_options()
    assert "--platform" not in opts and arg(opts, "--python-version") == HERE
    assert tgt.label.startswith("this machine (")


def test_platform_tags_expand_to_what_the_node_accepts():
    assert bundle.target("3.12", "manylinux2014_aarch64").platforms()[:2] == ["manylinux_2_17_aarch64",
                                                                              "manylinux_2_16_aarch64"]
    assert "manylinux2014_aarch64" in bundle.target("3.12", "manylinux2014_aarch64").platforms()
    assert bundle.target("3.12", "musllinux_1_2_x86_64").platforms() == ["musllinux_1_2_x86_64",
                                                                        "musllinux_1_1_x86_64"]
    env = bundle.target("3.12", "manylinux_2_28_aarch64").environment()
    assert (env["python_version"], env["sys_platform"], env["platform_machine"]) == ("3.12", "linux", "aarch64")


def test_the_install_line_for_the_node():
    assert bundle.install_line("/scratch/wheels", ["gpu", "lm"]) == \
        "pip install --no-index --find-links /scratch/wheels 'attnbench[gpu,lm]'"
    assert bundle.install_line("w", []) == "pip install --no-index --find-links w attnbench"


# --- bad input: one line, what and what to do -----------------------------------------------------------------------


@pytest.mark.parametrize("python,platform,says", [
    ("3", None, "--python must be a Python version like 3.12"),
    ("python3.12", None, "--python must be a Python version like 3.12"),
    ("3.8", None, "attnbench needs Python >=3.10"),
    ("3.12", "win_amd64", "--platform must be a Linux wheel platform tag such as manylinux_2_28_x86_64"),
    ("3.12", "manylinux_x86_64", "--platform must be a Linux wheel platform tag"),
])
def test_bad_target_is_one_clear_line(python, platform, says):
    with pytest.raises(bundle.BundleError, match=says) as e:
        bundle.target(python, platform)
    assert "\n" not in str(e.value) and not isinstance(e.value, bundle.BuildError)


def test_unknown_extra_names_the_known_ones():
    assert bundle.extras("gpu, lm,gpu") == ["gpu", "lm"]
    with pytest.raises(bundle.BundleError, match=r"unknown extra 'gpus': attnbench's extras are gpu, lm"):
        bundle.extras("gpus")


def test_bad_options_fail_before_pip_runs(tmp_path):
    pip = FakePip()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for kwargs, says in [({"torch": "latest"}, "--torch must be"), ({"limit_mib": 0}, "--max-mib must be"),
                         ({"out": str(tmp_path / "full")}, "exists and is not an empty folder")]:
        with pytest.raises(bundle.BundleError, match=says):
            bundle.build(kwargs.pop("out", str(tmp_path / "b")), run=pip, **kwargs)
    assert pip.calls == []


# --- the bundle: manifest, size, source archives, pip's failures -------------------------------------------------


def test_the_bundle_holds_what_the_node_lacks_with_its_manifest(tmp_path):
    pip = FakePip(resolved=NOT_ON_312)
    lines = []
    made = bundle.build(str(tmp_path / "b"), python="3.12", platform="manylinux_2_28_x86_64", extras_text="gpu,lm",
                        torch="2.11", command="attnbench bundle ...", run=pip, progress=lines.append, limit_mib=60)
    files = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert "manifest.json" in files and "attnbench-0.1.0-py3-none-any.whl" in files
    assert not any(f.startswith(("torch", "triton", "nvidia", "sympy", "mpmath")) for f in files)
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["python"] == "3.12" and m["platform"] == "manylinux_2_28_x86_64" and m["extras"] == ["gpu", "lm"]
    assert m["command"] == "attnbench bundle ..." and m["torch"] == "2.11"
    assert m["install"] == f"pip install --no-index --find-links {tmp_path / 'b'} 'attnbench[gpu,lm]'"
    assert {w["file"] for w in m["wheels"]} == {f for f in files if f.endswith(".whl")}
    assert m["total_bytes"] == sum(w["bytes"] for w in m["wheels"]) == sum(
        (tmp_path / "b" / f).stat().st_size for f in files if f.endswith(".whl"))
    assert m["built_from_source"] == ["sqlitedict-2.1.0-py3-none-any.whl"]
    assert "torch==2.11.0" in m["left_out"] and "triton==3.6.0" in m["left_out"]
    # pip resolved the node's torch, then fetched exactly the versions it chose, no more
    resolve = [c for c in pip.of("install") if "--python-version" in c][-1]
    assert "torch==2.11.*" in resolve
    pins = [a for a in pip.of("download")[0] if "==" in a]
    assert pins == sorted(f"{n}=={GRAPH[n][0]}" for n in ("numpy", "jinja2", "markupsafe", "flash-linear-attention",
                                                           "fla-core", "einops", "datasets", "fsspec", "aiohttp",
                                                           "sqlitedict"))
    assert made.lines()[-1] == f"on the node: {m['install']}"
    assert any("sqlitedict==2.1.0 is published only as a source archive" in line for line in lines)
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no staging folder left


def test_over_the_limit_fails_naming_the_largest_and_leaves_nothing(tmp_path):
    with pytest.raises(bundle.BuildError) as e:
        bundle.build(str(tmp_path / "b"), extras_text="gpu", run=FakePip(), limit_mib=10)
    msg = str(e.value)
    assert msg.startswith("the bundle is 17.") and "over the 10 MiB limit" in msg and "numpy 16.0" in msg
    assert "choose fewer --extras, or raise --max-mib" in msg and "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_check_size_at_the_limit():
    bundle.check_size([{"file": "a-1-py3-none-any.whl", "bytes": 60 * bundle.MiB}], 60)
    with pytest.raises(bundle.BuildError, match="60.0 MiB, over the 59 MiB limit"):
        bundle.check_size([{"file": "a-1-py3-none-any.whl", "bytes": 60 * bundle.MiB}], 59)


def test_a_missing_requirement_of_the_node_is_resolved_again(tmp_path):
    graph_numpy = ("2.4.6", ["packaging; python_version >= '3.12'"], 16 << 20)
    GRAPH_PLUS = dict(GRAPH, numpy=graph_numpy, packaging=("26.4", [], 130_000))

    class Pip(FakePip):
        def __call__(self, argv):
            if "--python-version" in argv and argv[3] == "install":
                self.calls.append(list(argv))
                names = NOT_ON_312 + (["packaging"] if "packaging" in argv else [])
                with open(arg(argv, "--report"), "w") as f:
                    json.dump(report(names, GRAPH_PLUS), f)
                return subprocess.CompletedProcess(argv, 0, "", "")
            return super().__call__(argv)

    pip = Pip()
    bundle.build(str(tmp_path / "b"), python="3.12", platform="manylinux_2_28_x86_64", run=pip)
    assert [a for a in pip.of("download")[0] if "==" in a] == ["jinja2==3.1.6", "markupsafe==3.0.4",
                                                                "numpy==2.4.6", "packaging==26.4"]


def test_a_source_only_package_that_is_not_pure_python_is_a_clear_error(tmp_path):
    with pytest.raises(bundle.BuildError, match=r"no wheel of sqlitedict .*not pure Python \(built here: "
                                                r"sqlitedict-2.1.0-cp311-cp311-linux_x86_64.whl\)"):
        bundle.build(str(tmp_path / "b"), extras_text="lm", run=FakePip(impure={"sqlitedict"}))
    assert list(tmp_path.iterdir()) == []


def test_pip_finding_no_wheel_names_the_package(tmp_path):
    out = ("Collecting numpy\nERROR: Could not find a version that satisfies the requirement numpy>=1.24 (from "
           "attnbench) (from versions: none)\nERROR: No matching distribution found for numpy>=1.24\n")
    pip = FakePip(fail=("install", out, lambda argv: "--python-version" in argv), impure={"numpy"})
    with pytest.raises(bundle.BuildError) as e:
        bundle.build(str(tmp_path / "b"), python="3.12", platform="manylinux_2_28_x86_64", run=pip)
    assert str(e.value) == ("no wheel of numpy>=1.24 for Python 3.12 on manylinux_2_28_x86_64, and it is not pure "
                            "Python (built here: numpy-1.0-cp311-cp311-linux_x86_64.whl): choose another "
                            "--python/--platform, or fewer --extras")


def test_no_wheel_of_a_provided_package_says_so(tmp_path):
    out = ("ERROR: Cannot install attnbench==0.1.0 because these package versions have conflicting dependencies.\n\n"
           "Additionally, some packages in these conflicts have no matching distributions available for your "
           "environment:\n    torch\n\nTo fix this you could try to:\n")
    pip = FakePip(fail=("install", out, lambda argv: "--python-version" in argv))
    with pytest.raises(bundle.BuildError) as e:
        bundle.build(str(tmp_path / "b"), python="3.12", platform="musllinux_1_2_x86_64", run=pip)
    assert str(e.value) == ("pip found no wheel of torch for Python 3.12 on musllinux_1_2_x86_64 (resolving "
                            "attnbench): check --python and --platform against the node")


def test_a_resolution_conflict_is_pips_own_line(tmp_path):
    out = ("ERROR: Cannot install attnbench because these package versions have conflicting dependencies.\n\n"
           "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...\n")
    pip = FakePip(fail=("install", out, lambda argv: "--python-version" in argv))
    with pytest.raises(bundle.BuildError) as e:
        bundle.build(str(tmp_path / "b"), python="3.12", platform="manylinux_2_28_x86_64", run=pip)
    assert str(e.value) == ("pip could not resolve attnbench for Python 3.12 on manylinux_2_28_x86_64: Cannot "
                            "install attnbench because these package versions have conflicting dependencies.")


def test_pips_messages_read():
    backtracked = ("ERROR: Cannot install attnbench because these package versions have conflicting dependencies."
                   "\n\nAdditionally, some packages in these conflicts have no matching distributions available for "
                   "your environment:\n    sqlitedict\n    word2number\n\nTo fix this you could try to:\nERROR: "
                   "ResolutionImpossible: for help visit https://pip.pypa.io/...\n")
    assert bundle.unavailable(backtracked) == ["sqlitedict", "word2number"]
    assert bundle.pip_error(backtracked) == ("Cannot install attnbench because these package versions have "
                                             "conflicting dependencies.")
    assert bundle.unavailable("ERROR: No matching distribution found for nvidia-cudnn-cu13==9.19.0.56; "
                              "platform_system == \"Linux\"") == ["nvidia-cudnn-cu13==9.19.0.56"]


# --- the command ---------------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_exit_codes(tmp_path, monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(bundle, "_run", pip)
    bad = runner.invoke(app, ["bundle", "--out", str(tmp_path / "b"), "--python", "3.x"])
    assert bad.exit_code == 2 and "error: --python must be a Python version like 3.12" in bad.output
    bad = runner.invoke(app, ["bundle", "--out", str(tmp_path / "b"), "--extras", "gpu,cuda"])
    assert bad.exit_code == 2 and "unknown extra 'cuda'" in bad.output
    assert pip.calls == []
    ok = runner.invoke(app, ["bundle", "--out", str(tmp_path / "b"), "--extras", "gpu"])
    assert ok.exit_code == 0, ok.output
    assert f"pip install --no-index --find-links {tmp_path / 'b'} 'attnbench[gpu]'" in ok.stdout
    over = runner.invoke(app, ["bundle", "--out", str(tmp_path / "c"), "--extras", "gpu", "--max-mib", "5"])
    assert over.exit_code == 1 and "over the 5 MiB limit" in over.output
    monkeypatch.setattr(bundle, "_run", FakePip(fail=("download", "ERROR: HTTP error 503\n")))
    down = runner.invoke(app, ["bundle", "--out", str(tmp_path / "d")])
    assert down.exit_code == 1 and "pip could not download the wheels" in down.output and "503" in down.output


@pytest.mark.skipif(not os.environ.get("ATTNBENCH_BUNDLE_NETWORK"), reason="set ATTNBENCH_BUNDLE_NETWORK=1 to "
                    "build a real bundle through pip and the package index")
def test_a_real_bundle_for_a_python_312_node(tmp_path):
    made = bundle.build(str(tmp_path / "b"), python="3.12", platform="manylinux_2_28_x86_64", extras_text="slurm",
                        torch="2.11", limit_mib=500)
    files = [w["file"] for w in made.manifest["wheels"]]
    assert any(f.startswith("submitit-") for f in files) and any(f.startswith("numpy-") and "cp312" in f
                                                                  for f in files)
    assert not any(f.startswith(("torch-", "triton-", "nvidia")) for f in files)
