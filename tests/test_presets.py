"""The shared preset loader (attnbench/engine/presets.py) and every suite's built-in presets.

The pins below are each built-in preset's key, identity hash and loaded content as they were before the loaders
were unified: a changed identity hash would make every user's store re-run its cells and detach the committed
results from their presets, so any change here must be deliberate.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from attnbench.results import provenance

# (suite, preset): (key, identity hash, content hash of the loaded dataclass without its path). Scaling presets had
# no key before: their setting was "scaling/<name>", what the key is now.
PINS = {
    ("lra", "skyformer"): ("lra/skyformer", "f95b1398c13a8d19", "5dc530827ee9cefc"),
    ("lra", "tiny"): ("lra/tiny", "a3318454c3aa18e8", "a2c72b5d5cfdd5ad"),
    ("vision", "cifar10"): ("vision/cifar10", "7efb33c2f363a2af", "56fe15ac66f1c396"),
    ("vision", "imagenet100"): ("vision/imagenet100", "b97005c5399754cf", "b495493f773c12b8"),
    ("vision", "imagenet1k"): ("vision/imagenet1k", "9e7557c943990d49", "78fa36f4cfd4c55c"),
    # content changed on purpose when the tiny presets gave nystromformer, skyformer and linformer a quarter of the
    # tokens as laplacian (attn_options: not in the identity, which is unchanged; each cell hashes its options)
    ("vision", "tiny"): ("vision/tiny", "0217831db188727b", "58011c0d26868f71"),
    ("vision", "tiny-deep"): ("vision/tiny-deep", "08ec59f94a61b4b8", "cde24da287eefbb3"),
    ("adala", "tiny"): ("adala/tiny", "340a70f345bb0cb3", "a296b05630162796"),
    ("mixa", "tiny"): ("mixa/tiny", "d65bd091ecc80997", "14da6563f47c20f2"),   # its vision preset's options, above
    # the identity its committed records carry, from when it was a file under results/mixa/presets/
    ("mixa", "tiny-deep"): ("mixa/tiny-deep", "5804cc6bce8a6fc8", "f7a788224f2730b2"),
    # changed on purpose when the LM presets gained the Transformer, RetNet, GLA and Mamba rows: a preset's identity
    # no longer holds every layer's table (each cell hashes its own layer's), so a new row leaves the others' cells
    ("lm", "340m"): ("lm/340m", "f9ce6f8d6a32a185", "30f0d41c9bf6d4b6"),
    ("lm", "tiny"): ("lm/tiny", "62d57aa23f549fa3", "cc4f15a8f9e39be3"),
    ("scaling", "cpu-default"): ("scaling/cpu-default", None, "f9d5f921cb5e0d5c"),
    ("scaling", "cpu-full"): ("scaling/cpu-full", None, "b86746ed2f2aab61"),
    ("scaling", "tiny"): ("scaling/tiny", None, "7ba9e99d2bddf352"),
}
SUITES = ("lra", "vision", "adala", "mixa", "lm", "scaling")


def _config(suite: str):
    return importlib.import_module(f"attnbench.suites.{suite}.config")


def _content(suite: str, pre) -> str:
    """The loaded preset as data, without where it was read from (and without the header fields a suite gained
    empty when the header became shared)."""
    d = dataclasses.asdict(pre)
    d.pop("path", None)
    if suite == "scaling":
        for k in ("source", "setting"):
            if d.get(k, None) == "":
                del d[k]
    if isinstance(d.get("vision"), dict):
        d["vision"].pop("path", None)
        if suite == "adala":  # adala held the vision preset's name before it held the loaded preset
            d["vision"] = d["vision"]["name"]
    return provenance.config_hash(d)


def _identity(suite: str, pre):
    if suite == "lra":  # LRA hashes per cell: the model, the task, the attention and its options
        return provenance.config_hash({t: pre.cell_hash(t, "softmax", {}) for t in pre.tasks})
    if suite == "scaling":  # a scaling point's identity is its own parameters (suites/scaling/runner.py)
        return None
    return pre.identity_hash()


def test_every_built_in_preset_is_pinned():
    assert sorted(PINS) == sorted((s, n) for s in SUITES for n in _config(s).preset_names())


@pytest.mark.parametrize("suite,name", sorted(PINS))
def test_built_in_presets_keep_their_key_and_identity_hash(suite, name):
    pre = _config(suite).load_preset(name)
    key, ident, content = PINS[(suite, name)]
    assert (getattr(pre, "key", None), _identity(suite, pre), _content(suite, pre)) == (key, ident, content)


# --- the shared loader ------------------------------------------------------------------------------------------
from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402

from attnbench.core.errors import UnknownNameError  # noqa: E402
from attnbench.engine.presets import PresetError, resolve_reference  # noqa: E402


def _builtin_text(suite: str, name: str) -> str:
    return (resources.files(f"attnbench.suites.{suite}") / "presets" / f"{name}.toml").read_text()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_reference_to_another_preset_is_a_built_in_name_or_a_file_beside_the_naming_preset(tmp_path, monkeypatch):
    assert resolve_reference("tiny", tmp_path) == "tiny"
    assert resolve_reference("v.toml", tmp_path) == str(tmp_path / "v.toml")
    assert resolve_reference(str(tmp_path / "x" / "v.toml"), Path("/elsewhere")) == str(tmp_path / "x" / "v.toml")
    vision = _builtin_text("vision", "tiny").replace('name = "tiny"', 'name = "mine"')
    _write(tmp_path / "cfg" / "v.toml", vision)
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory plays no part
    for suite in ("mixa", "adala"):
        text = _builtin_text(suite, "tiny")
        cfg = _config(suite)
        by_file = cfg.load_preset(str(_write(tmp_path / "cfg" / f"{suite}.toml", text.replace(
            'vision = "tiny"', 'vision = "v.toml"'))))
        assert by_file.vision.name == "mine" and by_file.vision.path == str(tmp_path / "cfg" / "v.toml")
        assert cfg.load_preset(str(_write(tmp_path / "cfg" / f"{suite}-abs.toml", text.replace(
            'vision = "tiny"', f'vision = "{tmp_path / "cfg" / "v.toml"}"')))).vision.name == "mine"
        by_name = cfg.load_preset(str(_write(tmp_path / f"{suite}.toml", text)))
        assert by_name.vision.name == "tiny" and by_name.vision.path == "presets/tiny.toml"
        assert by_name.identity_hash() == cfg.load_preset("tiny").identity_hash()
        missing = _write(tmp_path / "cfg" / f"{suite}-missing.toml",
                         text.replace('vision = "tiny"', 'vision = "w.toml"'))
        with pytest.raises(PresetError, match=rf"^{missing}: vision = 'w.toml': preset file .*cfg/w.toml' does not "
                                              rf"exist$"):
            cfg.load_preset(str(missing))
        typo = _write(tmp_path / f"{suite}-typo.toml", text.replace('vision = "tiny"', 'vision = "tinny"'))
        with pytest.raises(PresetError, match=rf"^{typo}: vision = 'tinny': unknown vision preset 'tinny'; did you "
                                              rf"mean 'tiny'"):
            cfg.load_preset(str(typo))


@pytest.mark.parametrize("suite", SUITES)
def test_every_suite_reports_top_level_mistakes_in_one_line_naming_file_and_key(suite, tmp_path):
    text = _builtin_text(suite, "tiny")
    cfg = _config(suite)
    cases = [(text.replace('\nname = "tiny"', '\nnam = "tiny"'),
              r"top level: unknown key 'nam' \(did you mean 'name'\?\)"),
             (text.replace('\nname = "tiny"', '\nname = 3'), r"top level: key 'name': expected str, got 3"),
             (text.replace('\nname = "tiny"', '\n'), r"top level: missing key 'name'")]
    for i, (bad, match) in enumerate(cases):
        assert bad != text
        path = _write(tmp_path / f"{i}.toml", bad)
        with pytest.raises(PresetError, match=rf"^{path}: {match}") as e:
            cfg.load_preset(str(path))
        assert "\n" not in str(e.value)
    with pytest.raises(UnknownNameError, match=rf"unknown {'LRA' if suite == 'lra' else suite} preset 'tinny'; "
                                               rf"did you mean 'tiny'"):
        cfg.load_preset("tinny")


def test_a_presets_own_checks_are_reported_with_its_file(tmp_path):
    text = _builtin_text("adala", "tiny")
    bad = _write(tmp_path / "a.toml", text.replace('metric = "loss"', 'metric = "top1"', 1))
    with pytest.raises(PresetError, match=rf"^{bad}: \[stage1\] metric must be 'loss'"):
        _config("adala").load_preset(str(bad))
    bad = _write(tmp_path / "m.toml", _builtin_text("mixa", "tiny").replace('linear = "stella"', 'linear = "stela"'))
    with pytest.raises(PresetError, match=rf"^{bad}: \[select\]: select.linear = 'stela': unknown attention 'stela'; "
                                          rf"did you mean 'stella'"):
        _config("mixa").load_preset(str(bad))
    pre = _config("mixa").load_preset("tiny")  # parsed once on load: the runner gets specs, the identity the text
    assert (pre.select.quadratic_spec.label, pre.select.linear_spec.label) == ("relu_quadratic", "stella")


def test_no_suite_imports_another_suite():
    """Suites import the core, never each other: a preset naming another suite's preset loads it through that
    suite's registered ``load_preset`` (:func:`attnbench.engine.presets.load_suite_preset`)."""
    import ast

    root = Path(__file__).parents[1] / "suites"
    suites = sorted(p.name for p in root.iterdir() if (p / "__init__.py").exists())
    assert {"vision", "adala", "mixa", "claims", "lra", "lm", "scaling"} <= set(suites)
    for suite in suites:
        for file in (root / suite).rglob("*.py"):
            tree = ast.parse(file.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0]
            others = [m for m in names if m.startswith("attnbench.suites.") and m.split(".")[2] != suite]
            others += [m for m in names if m.startswith("suites.")]
            assert others == [], (str(file), others)
