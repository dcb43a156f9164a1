"""The vision suite's data layer: digits splits, CIFAR pickles and ImageFolder trees the tests write."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from attnbench.core.errors import DataError, DataMissingError, UnknownNameError
from attnbench.image import data as vd

# ------------------------------------------------------------------------------------------------ digits


def test_digits_splits_shape_determinism_disjointness():
    s = vd.load_digits_splits(image_size=24, seed=0)
    assert s.sizes() == (1257, 270, 270)
    assert s.num_classes == 10 and s.class_names == [str(d) for d in range(10)]
    assert "sklearn digits 8x8" in s.origin and "24x24" in s.origin and "1257/270/270" in s.origin
    x, y = s.train[0]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32 and isinstance(y, int)
    # standardised on the train split
    xs = torch.stack([s.train[i][0] for i in range(0, 1257, 5)])
    assert abs(float(xs.mean())) < 0.2 and 0.6 < float(xs.std()) < 1.4
    # a DataLoader batches items with the default collate
    xb, yb = next(iter(torch.utils.data.DataLoader(s.val, batch_size=8)))
    assert xb.shape == (8, 3, 24, 24) and yb.dtype == torch.int64

    again = vd.load_digits_splits(image_size=24, seed=0)
    assert again.fingerprint == s.fingerprint
    assert torch.equal(again.test[7][0], s.test[7][0])
    other = vd.load_digits_splits(image_size=24, seed=1)
    assert other.fingerprint != s.fingerprint
    assert vd.load_digits_splits(image_size=32, seed=0).fingerprint != s.fingerprint

    # disjoint and complete: compare the raw 8x8 images' byte strings, with multiplicity
    def keys(ds):
        return [ds.images[i].numpy().tobytes() + bytes([ds.targets[i]]) for i in range(len(ds))]

    from sklearn.datasets import load_digits

    d = load_digits()
    every = sorted(d.images[i].astype(np.float32).tobytes() + bytes([d.target[i]]) for i in range(len(d.target)))
    assert sorted(keys(s.train) + keys(s.val) + keys(s.test)) == every
    # stratified: every class in every split
    for ds in (s.train, s.val, s.test):
        assert set(ds.targets.tolist()) == set(range(10))


def test_digits_crop_augment_changes_train_only():
    s = vd.load_digits_splits(image_size=16, seed=0, augment="crop")
    torch.manual_seed(0)
    a = s.train[3][0]
    b = torch.stack([s.train[3][0] for _ in range(8)])
    assert a.shape == (3, 16, 16) and not all(torch.equal(a, bi) for bi in b)
    assert torch.equal(s.val[3][0], s.val[3][0])
    assert "random crop" in s.origin


# -------------------------------------------------------------------------------------------------- CIFAR


def _batch(n, classes, seed, label_key):
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"testing batch", label_key: [int(v) for v in rng.integers(0, classes, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"img_%d.png" % i for i in range(n)]}


def _dump(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root, n_per_batch=4, n_test=6):
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for i in range(1, 6):
        _dump(d / f"data_batch_{i}", _batch(n_per_batch, 10, i, b"labels"))
    _dump(d / "test_batch", _batch(n_test, 10, 99, b"labels"))
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    _dump(d / "batches.meta", {b"label_names": names, b"num_cases_per_batch": n_per_batch, b"num_vis": 3072})
    return d


def write_cifar100(root, n_train=20, n_test=6):
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    for name, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        b = _batch(n, 100, seed, b"fine_labels")
        b[b"coarse_labels"] = [v // 5 for v in b[b"fine_labels"]]
        _dump(d / name, b)
    _dump(d / "meta", {b"fine_label_names": [b"class%d" % i for i in range(100)],
                       b"coarse_label_names": [b"super%d" % i for i in range(20)]})
    return d


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_cifar10_reader(tmp_path):
    d = write_cifar10(tmp_path)
    s = vd.load_cifar(tmp_path, 10, 32, val_size=4, seed=0)
    assert s.sizes() == (16, 4, 6) and s.num_classes == 10 and s.class_names[0] == "airplane"
    assert "CIFAR-10 python pickles at" in s.origin and str(d) in s.origin and "16/4/6" in s.origin
    # pixels arrive in the right place: the eval transform at 32 px is ToTensor + Normalize
    raw = pickle.load(open(d / "test_batch", "rb"), encoding="bytes")
    x, y = s.test[2]
    mean, std = vd.CIFAR_STATS[10]
    want = torch.tensor(raw[b"data"][2].reshape(3, 32, 32), dtype=torch.float32) / 255
    want = (want - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    assert x.shape == (3, 32, 32) and y == raw[b"labels"][2]
    torch.testing.assert_close(x, want, atol=1e-5, rtol=0)
    assert s.train[0][0].shape == (3, 32, 32)
    # the val split is carved deterministically and disjoint from train
    assert set(s.val.indices.tolist()).isdisjoint(s.train.indices.tolist())
    s2 = vd.load_cifar(d, 10, 32, val_size=4, seed=0)  # root may be the release folder itself
    assert s2.fingerprint == s.fingerprint and np.array_equal(s2.val.indices, s.val.indices)
    assert vd.load_cifar(tmp_path, 10, 32, val_size=4, seed=1).fingerprint != s.fingerprint
    # upsampled to a ViT's input size through the DeiT recipe
    big = vd.build_splits("cifar10", root=tmp_path, image_size=64, val_size=4, augment="deit")
    assert big.train[0][0].shape == (3, 64, 64) and big.test[0][0].shape == (3, 64, 64)


def test_cifar100_reader(tmp_path):
    write_cifar100(tmp_path)
    s = vd.build_splits("cifar100", root=tmp_path, val_size=5)
    assert s.sizes() == (15, 5, 6) and s.num_classes == 100 and s.class_names[3] == "class3"
    raw = pickle.load(open(tmp_path / "cifar-100-python" / "train", "rb"), encoding="bytes")
    assert s.train.targets.tolist() == [raw[b"fine_labels"][i] for i in s.train.indices]
    assert s.val[0][0].shape == (3, 32, 32)


@pytest.mark.parametrize("which", [10, 100])
@pytest.mark.parametrize("damage", ["truncated", "wrong_keys", "wrong_shape", "not_a_pickle", "code"])
def test_cifar_malformed_pickle_names_the_file(tmp_path, which, damage):
    d = write_cifar10(tmp_path) if which == 10 else write_cifar100(tmp_path)
    target = d / ("data_batch_3" if which == 10 else "train")
    if damage == "truncated":
        blob = target.read_bytes()
        target.write_bytes(blob[: len(blob) // 2])
    elif damage == "wrong_keys":
        _dump(target, {b"images": np.zeros((4, 3072), np.uint8), b"targets": [0] * 4})
    elif damage == "wrong_shape":
        key = b"labels" if which == 10 else b"fine_labels"
        _dump(target, {b"data": np.zeros((4, 1024), np.uint8), key: [0] * 4})
    elif damage == "not_a_pickle":
        target.write_bytes(b"this is not a pickle at all")
    else:  # a pickle that would run code: refused, not executed
        target.write_bytes(pickle.dumps({b"data": __import__("os").getcwd}))
    with pytest.raises(DataError) as exc:
        vd.load_cifar(tmp_path, which, 32, val_size=2)
    msg = _one_line(exc)
    assert msg.startswith(str(target)) and f"CIFAR-{which}" in msg


@pytest.mark.parametrize("which", [10, 100])
def test_cifar_missing_file_and_folder(tmp_path, which):
    d = write_cifar10(tmp_path) if which == 10 else write_cifar100(tmp_path)
    gone = d / ("test_batch" if which == 10 else "test")
    gone.unlink()
    with pytest.raises(FileNotFoundError) as exc:
        vd.load_cifar(tmp_path, which, 32, val_size=2)
    msg = _one_line(exc)
    assert str(gone) in msg and ("data_batch_1..5" in msg if which == 10 else "{train,test,meta}" in msg)
    with pytest.raises(DataMissingError) as exc:
        vd.load_cifar(tmp_path / "nowhere", which, 32)
    msg = _one_line(exc)
    assert str(tmp_path / "nowhere") in msg and d.name in msg


def test_cifar_bad_label_names_the_file(tmp_path):
    d = write_cifar10(tmp_path)
    _dump(d / "data_batch_2", {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 10, 2]})
    with pytest.raises(DataError, match=re.escape(str(d / "data_batch_2")) + ".*outside 0..9"):
        vd.load_cifar(tmp_path, 10, 32, val_size=2)


# ------------------------------------------------------------------------------------------- ImageFolder

WNIDS = ["n01440764", "n01443537", "n01484850"]


def write_imagefolder(root, wnids=WNIDS, per_class=4, val_per_class=2):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c, w in enumerate(wnids):
            (root / split / w).mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (20 + 3 * i, 24, 3), dtype=np.uint8)
                ext = ".JPEG" if i % 2 == 0 else ".png"
                Image.fromarray(arr).save(root / split / w / f"{w}_{i}{ext}")
    return root


def test_imagefolder_all_classes_and_transforms(tmp_path):
    write_imagefolder(tmp_path)
    s = vd.load_imagefolder(tmp_path, None, 32, val_per_class=1, seed=0)
    assert s.num_classes == 3 and s.class_names == WNIDS
    assert s.sizes() == (9, 3, 6)
    assert "ImageNet ImageFolder at" in s.origin and "all 3 classes" in s.origin
    for ds in (s.train, s.val, s.test):
        x, y = ds[0]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= y < 3
    assert sorted(s.val.targets.tolist()) == [0, 1, 2]
    assert set(s.val.indices.tolist()).isdisjoint(s.train.indices.tolist())
    assert s.augment == "deit" and "RandAugment" in repr(s.train.transform)
    assert "CenterCrop" in repr(s.test.transform)
    again = vd.load_imagefolder(tmp_path, None, 32, val_per_class=1, seed=0)
    assert again.fingerprint == s.fingerprint and np.array_equal(again.val.indices, s.val.indices)


def test_imagefolder_class_filter_by_file_and_count(tmp_path):
    write_imagefolder(tmp_path / "data")
    lst = tmp_path / "subset.txt"
    lst.write_text("# two of the three\n\nn01484850   # great white shark\nn01440764\n")
    s = vd.load_imagefolder(tmp_path / "data", lst, 32, val_per_class=1)
    assert s.class_names == ["n01440764", "n01484850"] and s.num_classes == 2
    assert s.sizes() == (6, 2, 4) and "2 classes from subset.txt" in s.origin
    assert {p.split("/")[-2] for p, _ in s.test.folder.samples} == {"n01440764", "n01484850"}
    assert sorted(set(s.test.targets.tolist())) == [0, 1]

    first = vd.build_splits("imagenet", root=tmp_path / "data", classes="2", image_size=32, val_per_class=1)
    assert first.class_names == WNIDS[:2] and "first 2 classes" in first.origin
    assert vd.build_splits("imagenet", root=tmp_path / "data", classes=["n01443537"], image_size=32,
                           val_per_class=1).class_names == ["n01443537"]
    with pytest.raises(DataError, match="classes=4 but there are 3 class folders"):
        vd.load_imagefolder(tmp_path / "data", 4, 32)


def test_imagefolder_unknown_wnid_names_file_and_line(tmp_path):
    write_imagefolder(tmp_path / "data")
    lst = tmp_path / "subset.txt"
    lst.write_text("# header\nn01440764\nn01443538\n")
    with pytest.raises(DataError) as exc:
        vd.load_imagefolder(tmp_path / "data", lst, 32, val_per_class=1)
    msg = _one_line(exc)
    assert msg.startswith(f"{lst}, line 3: ") and "'n01443538'" in msg and "n01443537" in msg  # did-you-mean
    lst.write_text("n01440764\nn01440764\n")
    with pytest.raises(DataError, match=re.escape(f"{lst}, line 2: ") + ".*twice"):
        vd.load_imagefolder(tmp_path / "data", lst, 32, val_per_class=1)


def test_imagefolder_layout_errors(tmp_path):
    root = write_imagefolder(tmp_path / "data")
    with pytest.raises(DataMissingError) as exc:
        vd.load_imagefolder(tmp_path / "absent", None, 32)
    assert "absent" in _one_line(exc) and "train/<wnid>" in str(exc.value)

    import shutil

    shutil.rmtree(root / "val" / WNIDS[1])
    with pytest.raises(FileNotFoundError) as exc:  # a class of the subset with no val folder
        vd.load_imagefolder(root, None, 32, val_per_class=1)
    assert str(root / "val" / WNIDS[1]) in _one_line(exc)

    shutil.rmtree(root / "val")
    with pytest.raises(DataMissingError) as exc:  # the split folder itself
        vd.load_imagefolder(root, None, 32, val_per_class=1)
    msg = _one_line(exc)
    assert msg.startswith(str(root / "val")) and "val/<wnid>/*.JPEG" in msg

    (root / "val").mkdir()  # ImageNet's raw val: images without class folders
    (root / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes((root / "train" / WNIDS[0] /
                                                                 f"{WNIDS[0]}_0.JPEG").read_bytes())
    with pytest.raises(DataError, match="not in class folders"):
        vd.load_imagefolder(root, None, 32, val_per_class=1)


def test_imagefolder_empty_class_and_unreadable_image(tmp_path):
    root = write_imagefolder(tmp_path / "data")
    for f in (root / "train" / WNIDS[2]).iterdir():
        f.unlink()
    with pytest.raises(DataError) as exc:
        vd.load_imagefolder(root, None, 32, val_per_class=1)
    assert _one_line(exc).startswith(str(root / "train" / WNIDS[2])) and "no image files" in str(exc.value)

    bad = root / "val" / WNIDS[0] / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8 definitely not a jpeg")
    s = vd.load_imagefolder(root, WNIDS[:2], 32, val_per_class=1, augment="none")
    i = [j for j, (p, _) in enumerate(s.test.folder.samples) if p.endswith("broken.JPEG")][0]
    with pytest.raises(OSError) as exc:
        s.test[i]
    assert _one_line(exc).startswith(str(bad)) and "unreadable image" in str(exc.value)


def test_imagefolder_too_few_images_for_val(tmp_path):
    root = write_imagefolder(tmp_path / "data")
    with pytest.raises(DataError, match="too few to carve val_per_class=4"):
        vd.load_imagefolder(root, None, 32, val_per_class=4)


# ----------------------------------------------------------------------------------- class list, dispatch


def test_shipped_imagenet100_list():
    entries = vd.read_class_list(vd.SHIPPED_CLASSLISTS["imagenet100"])
    wnids = [w for w, _ in entries]
    assert len(wnids) == 100 == len(set(wnids))
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
    assert wnids[:3] == ["n02869837", "n01749939", "n02488291"] and wnids[-1] == "n02090622"
    from importlib.resources import files

    assert (files("attnbench.image") / "classlists" / "imagenet100.txt").is_file()


def test_build_splits_dispatch_and_errors(tmp_path):
    s = vd.build_splits("digits", image_size=16)
    assert s.kind == "digits" and s.image_size == 16 and s.train[0][0].shape == (3, 16, 16)
    with pytest.raises(UnknownNameError, match="did you mean 'cifar10'"):
        vd.build_splits("cifar1O")
    with pytest.raises(DataMissingError, match="cifar-100-python"):
        vd.build_splits("cifar100")
    with pytest.raises(ValueError, match="imagenet only"):
        vd.build_splits("digits", classes=10)


def test_datasets_pickle_for_dataloader_workers(tmp_path):
    write_cifar10(tmp_path / "c")
    write_imagefolder(tmp_path / "i")
    splits = [vd.build_splits("digits", image_size=16, augment="crop"),
              vd.build_splits("cifar10", root=tmp_path / "c", val_size=4),
              vd.build_splits("imagenet", root=tmp_path / "i", image_size=32, val_per_class=1)]
    for s in splits:
        for ds in (s.train, s.test):
            back = pickle.loads(pickle.dumps(ds))
            assert len(back) == len(ds) and back[0][0].shape == ds[0][0].shape
    # and through a DataLoader with spawned workers (the start method of macOS and Windows)
    loader = torch.utils.data.DataLoader(splits[2].test, batch_size=3, num_workers=1,
                                         multiprocessing_context="spawn")
    xb, yb = next(iter(loader))
    assert xb.shape == (3, 3, 32, 32) and yb.tolist() == [0, 0, 1]
