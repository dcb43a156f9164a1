"""attnbench.io.formats: every pickle a reader opens goes through the safe unpickler (data, never code), and every
reader's bad file is one DataError line naming the file."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from attnbench.io import formats
from attnbench.core.errors import DataError, DataMissingError


class _Planted:
    """Pickles as a call of ``print`` (a global outside the allowed list): loading it must not call anything."""

    def __reduce__(self):
        return (print, ("planted pickle ran",))


def _cifar_batch(n: int = 3, *, label_key: bytes = b"labels") -> dict:
    rng = np.random.default_rng(0)
    return {b"batch_label": b"x", label_key: [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}


def _write(path, obj) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def test_a_pickle_naming_code_is_refused_and_never_runs(tmp_path, capsys):
    path = tmp_path / "data_batch_1"
    _write(path, {b"data": _Planted(), b"labels": [0]})
    with pytest.raises(DataError) as e:
        formats.read_cifar_batch(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: not a CIFAR-10 python pickle")
    assert "refusing to load global" in msg and "print" in msg  # protocol 2 names it __builtin__.print
    assert "planted pickle ran" not in capsys.readouterr().out


@pytest.mark.parametrize("reader", ["lra", "image"])
def test_both_cifar_readers_use_the_safe_unpickler(tmp_path, reader, capsys):
    from attnbench.image import data as image_data
    from attnbench.suites.lra import data as lra_data

    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _write(d / name, _cifar_batch())
    _write(d / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    _write(d / "data_batch_3", {b"data": _Planted(), b"labels": [0]})
    with pytest.raises(DataError, match="data_batch_3: not a CIFAR-10 python pickle .*refusing to load global"):
        if reader == "lra":
            lra_data.load_image(tmp_path, "train")
        else:
            image_data.load_cifar(tmp_path, 10, val_size=1)
    assert "planted pickle ran" not in capsys.readouterr().out


def test_lra_grey_images_are_the_rgb_reader_s_images_in_grey(tmp_path):
    from attnbench.suites.lra import data as lra_data

    batch = _cifar_batch(5)
    _write(tmp_path / "b", batch)
    grey, labels = lra_data.read_cifar_batch(tmp_path / "b")
    rgb = batch[b"data"].reshape(5, 3, 1024).transpose(0, 2, 1)  # [n, pixels, RGB], the release's plane order
    np.testing.assert_array_equal(grey, lra_data.rgb_to_gray(rgb))
    np.testing.assert_array_equal(labels, batch[b"labels"])


@pytest.mark.parametrize("payload, says", [
    ([1, 2], "expected a dict, found list"),
    ({b"labels": [1]}, "missing key(s) ['data']"),
    ({b"labels": [1, 2], b"data": np.zeros((2, 100), np.uint8)}, "'data' must be uint8 [n, 3072]"),
    ({b"labels": [1], b"data": np.zeros((2, 3072), np.uint8)}, "1 'labels' for 2 images"),
    ({b"labels": [1, 12], b"data": np.zeros((2, 3072), np.uint8)}, "label 12 of image 1 is outside 0..9"),
])
def test_malformed_batches_are_one_line_naming_the_file(tmp_path, payload, says):
    path = tmp_path / "data_batch_1"
    _write(path, payload)
    with pytest.raises(DataError) as e:
        formats.read_cifar_batch(path)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value) and "\n" not in str(e.value)


def test_truncated_pickle_and_meta(tmp_path):
    path = tmp_path / "test_batch"
    _write(path, _cifar_batch())
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(DataError, match="truncated"):
        formats.read_cifar_batch(path)
    meta = tmp_path / "meta"
    _write(meta, {b"fine_label_names": [b"a", b"b"]})
    with pytest.raises(DataError, match="must list 100 names, found 2"):
        formats.read_cifar_meta(meta, which=100)
    _write(meta, {b"fine_label_names": [f"n{i}".encode() for i in range(100)]})
    assert formats.read_cifar_meta(meta, which=100)[:2] == ["n0", "n1"]


def test_the_data_errors():
    e = DataError("bad header", path="a/b.tsv", line=3)
    assert str(e) == "a/b.tsv, line 3: bad header" and e.line == 3 and e.path.name == "b.tsv"
    assert str(DataError("no path")) == "no path"
    missing = DataMissingError("x: not there")
    assert isinstance(missing, FileNotFoundError) and isinstance(missing, DataError) and str(missing) == "x: not there"
