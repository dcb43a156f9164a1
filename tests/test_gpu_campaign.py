"""scripts/gpu_campaign.py, the GPU node's campaign, rehearsed on the CPU: attnbench's own wheel installed offline
(network cut where `unshare -n` works) into an overlay of this Python, the doctor run through it; nothing of the
"node" (this environment) changed, its GPU stack never replaced; packed wheels round-trip; bad input is one line
and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .helpers import load_file, small_doctor_preset

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_campaign.py"


campaign = load_file("gpu_campaign", SCRIPT)


def fake_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) of a pure-Python distribution."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    body = {f"{name}/__init__.py": b"", **(files or {}),
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    body[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in [*body, f"{info}/RECORD"]).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in body.items():
            z.writestr(k, v)
    return path


def run_script(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_pack_round_trips_every_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    a = fake_wheel(src, "alpha", "1.0", {"alpha/lib.so": bytes(range(256)) * 100})
    b = fake_wheel(src, "beta_pkg", "2.0")
    archive = tmp_path / "carry.tar.xz"
    assert campaign.pack([str(src)], str(archive))[0] == 2
    dest = tmp_path / "dest"
    dest.mkdir()
    wheels = campaign.gather([str(archive), str(fake_wheel(tmp_path, "attnbench", "0.1.0"))], dest)
    assert sorted(w.name for w in wheels) == sorted([a.name, b.name, "attnbench-0.1.0-py3-none-any.whl"])
    for original in (a, b):
        with zipfile.ZipFile(original) as x, zipfile.ZipFile(dest / original.name) as y:
            assert {i.filename: x.read(i) for i in x.infolist()} == {i.filename: y.read(i) for i in y.infolist()}
            assert y.testzip() is None


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    src = tmp_path / "w"
    src.mkdir()
    fake_wheel(src, "alpha", "1.0")
    r = run_script("run", "--wheels", str(src), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "no attnbench wheel among the 1 carried wheels" in r.stdout.splitlines()[-1]
    r = run_script("run", "--wheels", str(tmp_path / "missing"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no such file or folder" in r.stdout.splitlines()[-1]
    fake_wheel(src, "alpha", "2.0")
    fake_wheel(src, "attnbench", "0.1.0")
    with pytest.raises(campaign.CampaignError, match="two wheels of alpha"):
        campaign.gather([str(src)], tmp_path)
    (tmp_path / "junk.tar.xz").write_bytes(b"not xz")
    with pytest.raises(campaign.CampaignError, match="not a readable .tar.xz"):
        campaign.gather([str(tmp_path / "junk.tar.xz")], tmp_path)
    assert run_script("run", "--wheels", str(src), "--out", str(tmp_path), "--budget", "0").returncode == 2
    assert run_script("step", "--wheels", str(src), "--out", str(tmp_path), "--timeout", "0").returncode == 2
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    own = fake_wheel(tmp_path / "used", "attnbench", "0.1.0")
    r = run_script("step", "--wheels", str(own), "--out", str(tmp_path / "out"), "--env", str(tmp_path / "used"))
    assert r.returncode == 2 and "is not empty and is not a campaign's overlay" in r.stdout.splitlines()[-1]


def test_the_node_gpu_stack_is_never_replaced_and_shadowing_is_named(tmp_path):
    freeze = ("torch==2.11.0+cu130\nattnbench==0.1.0\nfoo @ file:///x\nNumPy==2.5.2\nnvidia-cublas==13.1\n"
              "typer==0.26.0\nTyping_Extensions==4.16.0\n")
    node = campaign.node_versions(freeze)
    assert node["torch"] == "2.11.0+cu130" and node["typing-extensions"] == "4.16.0" and "foo" not in node
    carried = [fake_wheel(tmp_path, n, v) for n, v in (("torch", "2.12.0"), ("numpy", "2.5.2"),
                                                      ("nvidia_cublas", "13.2"), ("typer", "0.1.0"))]
    assert campaign.replaces_gpu_stack(carried, node) == ["torch 2.12.0 (node: 2.11.0+cu130)",
                                                          "nvidia-cublas 13.2 (node: 13.1)"]
    for name in ("typing_extensions-4.17.0", "attnbench-0.2.0", "einops-0.8.2", "typer-0.26.0"):
        (tmp_path / f"{name}.dist-info").mkdir()
    assert campaign.shadowed(node, tmp_path) == ["typing-extensions 4.16.0 -> 4.17.0"]


@pytest.fixture(scope="module")
def own_wheel(tmp_path_factory) -> Path:
    """attnbench's wheel, built from this checkout with no network (no build isolation)."""
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                        "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("attnbench-*.whl"))


def offline() -> tuple[str, ...]:
    """``unshare -n``: the command runs with no network at all, where this machine allows it (root, CI)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return (unshare, "-n")
    return ()


def test_campaign_installs_offline_and_runs_the_doctor(own_wheel, tmp_path):
    """The whole campaign on the CPU: the overlay imports the carried attnbench, the doctor's records come back as
    jsonl, `step` times the training step through the same overlay, and the node's packages are what they were."""
    out, env = tmp_path / "out", tmp_path / "env"
    before = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True).stdout
    r = run_script("run", "--wheels", str(own_wheel), "--out", str(out), "--env", str(env),
                   "--budget", "2", "--", "--preset", small_doctor_preset(tmp_path), "--attn", "linear",
                   prefix=offline())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    log = (out / "campaign.log").read_text()
    assert "doctor: OK" in log and "campaign: doctor exit 0" in log
    records = [json.loads(line) for line in (out / "doctor.jsonl").read_text().splitlines()]
    assert {r["task"] for r in records} >= {"contract", "gate", "time"}
    assert (out / "doctor.md").read_text().startswith("# attnbench doctor")
    assert (out / "node.txt").read_text() == before
    where = subprocess.run([str(env / "bin" / "python"), "-P", "-c", "import attnbench; print(attnbench.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert where.startswith(str(env)), where
    # `step` in the same overlay (a second call on a node still warm): the training-step benchmark runs through it
    r = run_script("step", "--wheels", str(own_wheel), "--out", str(out / "step"), "--env", str(env), "--",
                   "--suites", "recall", "--recall", "softmax", "--repeats", "1", prefix=offline())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"the overlay at {env} is used again" in (out / "step" / "campaign.log").read_text()
    rows = [line.split() for line in (out / "step" / "train-step.txt").read_text().splitlines()]
    assert [row[:2] for row in rows if row[:1] == ["recall"]] == [["recall", "softmax"]]
    after = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                           text=True).stdout
    assert after == before


def test_a_wheel_that_would_replace_the_node_torch_stops_before_installing(own_wheel, tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    shutil.copy(own_wheel, wheels)
    fake_wheel(wheels, "torch", "0.0.1")  # the node has torch at another version
    r = run_script("run", "--wheels", str(wheels), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    last = r.stdout.splitlines()[-1]
    assert "would replace the node's GPU stack: torch 0.0.1 (node: " in last, last
    assert "pip --disable-pip-version-check" not in (tmp_path / "out" / "campaign.log").read_text()
