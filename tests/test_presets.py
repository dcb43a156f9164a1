"""The shared preset loader (attnbench/presets.py) and every suite's built-in presets.

The pins below are each built-in preset's key, identity hash and loaded content as they were before the loaders
were unified: a changed identity hash would make every user's store re-run its cells and detach the committed
results from their presets, so any change here must be deliberate.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from attnbench import provenance

# (suite, preset): (key, identity hash, content hash of the loaded dataclass without its path)
PINS = {
    ("lra", "skyformer"): ("lra/skyformer", "f95b1398c13a8d19", "5dc530827ee9cefc"),
    ("lra", "tiny"): ("lra/tiny", "a3318454c3aa18e8", "a2c72b5d5cfdd5ad"),
    ("vision", "cifar10"): ("vision/cifar10", "7efb33c2f363a2af", "56fe15ac66f1c396"),
    ("vision", "imagenet100"): ("vision/imagenet100", "b97005c5399754cf", "b495493f773c12b8"),
    ("vision", "imagenet1k"): ("vision/imagenet1k", "9e7557c943990d49", "78fa36f4cfd4c55c"),
    ("vision", "tiny"): ("vision/tiny", "0217831db188727b", "81a7c518f191c4e9"),
    ("adala", "tiny"): ("adala/tiny", "340a70f345bb0cb3", "a296b05630162796"),
    ("mixa", "tiny"): ("mixa/tiny", "d65bd091ecc80997", "2721e6c00d534155"),
    ("lm", "340m"): ("lm/340m", "d0a2273bd3878054", "37fce1a65163507f"),
    ("lm", "tiny"): ("lm/tiny", "4d2122df75d29eae", "6137f4f5219a63b2"),
    ("scaling", "cpu-default"): (None, None, "f9d5f921cb5e0d5c"),
    ("scaling", "cpu-full"): (None, None, "b86746ed2f2aab61"),
    ("scaling", "tiny"): (None, None, "7ba9e99d2bddf352"),
}
SUITES = ("lra", "vision", "adala", "mixa", "lm", "scaling")


def _config(suite: str):
    return importlib.import_module(f"attnbench.suites.{suite}.config")


def _content(pre) -> str:
    d = dataclasses.asdict(pre)
    d.pop("path", None)
    if isinstance(d.get("vision"), dict):
        d["vision"].pop("path", None)
    return provenance.config_hash(d)


def _identity(suite: str, pre):
    if hasattr(pre, "identity_hash"):
        return pre.identity_hash()
    if suite == "lra":  # LRA hashes per cell: the model, the task, the attention and its options
        return provenance.config_hash({t: pre.cell_hash(t, "softmax", {}) for t in pre.tasks})
    return None


def test_every_built_in_preset_is_pinned():
    assert sorted(PINS) == sorted((s, n) for s in SUITES for n in _config(s).preset_names())


@pytest.mark.parametrize("suite,name", sorted(PINS))
def test_built_in_presets_keep_their_key_and_identity_hash(suite, name):
    pre = _config(suite).load_preset(name)
    key, ident, content = PINS[(suite, name)]
    assert (getattr(pre, "key", None), _identity(suite, pre), _content(pre)) == (key, ident, content)
