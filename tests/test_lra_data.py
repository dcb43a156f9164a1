"""LRA data layer: readers on small files in the release formats (written here), their errors, and the
ListOps / Pathfinder generators (balance, bounds, determinism, markers really on one contour)."""

from __future__ import annotations

import csv
import pickle
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from attnbench.core.errors import DataError, DataMissingError
from attnbench.core.protocol import UnknownNameError
from attnbench.suites.lra import data as D
from attnbench.suites.lra import generate as G

# ----------------------------------------------------------------------------------------------- helpers


def write_listops(path, rows, header=("Source", "Target")):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        if header:
            w.writerow(header)
        w.writerows(rows)


def write_lines(path, lines, newline="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(newline.join(lines).encode() + newline.encode())


def listops_eval(source: str) -> tuple[int, int]:
    """Independent evaluator of an LRA ListOps source: (value, length without parentheses)."""
    toks = source.replace("(", " ").replace(")", " ").split()
    pos = 0

    def node():
        nonlocal pos
        t = toks[pos]
        pos += 1
        if t.isdigit():
            return int(t)
        args = []
        while toks[pos] != "]":
            args.append(node())
        pos += 1
        s = sorted(args)
        return {"[MIN": min(args), "[MAX": max(args), "[SM": sum(args) % 10,
                "[MED": int(np.median(s))}[t]

    v = node()
    assert pos == len(toks)
    return v, len(toks)


# ----------------------------------------------------------------------------------------------- ListOps


def test_listops_reads_release_layout_and_tokenises_as_lra(tmp_path):
    d = tmp_path / "lra_release" / "lra_release" / "listops-1000"  # as the archive unpacks
    rows = [["( ( ( [MAX 2 ) 9 ) ] )", 9], ["( ( ( ( [SM 3 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 5 ) ] )", 2]]
    for split in D.SPLITS:
        write_listops(d / f"basic_{split}.tsv", rows)
    ds = D.load_listops(tmp_path, "val", max_length=6)
    assert (len(ds), ds.vocab_size, ds.num_classes, ds.pad_id, ds.seq_len) == (2, 16, 10, 0, 6)
    v = {t: i for i, t in enumerate(D.LISTOPS_VOCAB)}
    first = ds[0]
    assert first["inputs"].dtype == torch.int64 and first["inputs"].shape == (6,)
    assert first["inputs"].tolist() == [v["[MAX"], v["2"], v["9"], v["X"], 0, 0]  # ( ) dropped, ] -> X, padded
    assert int(first["label"]) == 9
    # truncated to max_length: [SM 3 [MIN 4 7 X 5 X -> first 6
    assert ds[1]["inputs"].tolist() == [v["[SM"], v["3"], v["[MIN"], v["4"], v["7"], v["X"]]
    assert ds.lengths().tolist() == [4, 6]
    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    batch = next(iter(loader))
    assert batch["inputs"].shape == (2, 6) and batch["label"].tolist() == [9, 2]


@pytest.mark.parametrize("rows, line, words", [
    ([["( ( [MAX 2 ) 9 ) ] )", "7", "extra"]], 2, "3"),
    ([["( ( [MAX 2 ) 9 ) ] )", 9], ["( ( [MIN 2 ) 9 ) ] )", "two"]], 3, "not an integer"),
    ([["( ( [MAX 2 ) 9 ) ] )", 9], ["( ( [MAX 2 ) 9 ) ] )", 9], ["( ( [FIRST 2 ) 9 ) ] )", 2]], 4, "[FIRST"),
    ([["( ( [MAX 2 ) 12 ) ] )", 2]], 2, "'12'"),
    ([["( ( [MAX 2 ) 9 ) ] )", 10]], 2, "outside 0..9"),
])
def test_listops_malformed_names_file_and_line(tmp_path, rows, line, words):
    path = tmp_path / "listops-1000" / "basic_train.tsv"
    write_listops(path, rows)
    with pytest.raises(DataError) as e:
        D.load_listops(tmp_path, "train")
    msg = str(e.value)
    assert "basic_train.tsv" in msg and f"line {line}" in msg and words in msg, msg
    assert e.value.line == line


def test_listops_bad_header(tmp_path):
    path = tmp_path / "listops-1000" / "basic_test.tsv"
    write_listops(path, [["( ( [MAX 2 ) 9 ) ] )", 9]], header=("Src", "Tgt"))
    with pytest.raises(DataError, match=r"basic_test.tsv, line 1: expected the header"):
        D.load_listops(tmp_path, "test")


def test_missing_listops_explains_release_and_generator(tmp_path):
    with pytest.raises(DataMissingError) as e:
        D.load_listops(tmp_path / "nowhere", "train")
    msg = str(e.value)
    assert "lra_release" in msg and "attnbench data listops --out" in msg and "listops-1000" in msg
    assert isinstance(e.value, FileNotFoundError)


def test_split_and_task_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        D.load_listops(tmp_path, "dev")
    with pytest.raises(UnknownNameError, match="did you mean listops"):
        D.load_lra("listop", tmp_path, "train")


# -------------------------------------------------------------------------------------------- Text (IMDb)


def test_text_bytes_plus_one_and_val_is_imdb_test(tmp_path):
    base = tmp_path / "aclImdb"
    reviews = {("train", "neg", "0_3.txt"): "bad<br />film", ("train", "pos", "1_9.txt"): "très bien",
               ("train", "pos", "10_8.txt"): "ok", ("test", "neg", "5_1.txt"): "no", ("test", "pos", "7_7.txt"): "yes"}
    for (sub, cls, name), text in reviews.items():
        (base / sub / cls).mkdir(parents=True, exist_ok=True)
        (base / sub / cls / name).write_text(text, encoding="utf-8")
    (base / "train" / "unsup").mkdir()
    (base / "train" / "unsup" / "0_0.txt").write_text("ignored")
    tr = D.load_text(tmp_path, "train", max_length=8)
    assert (len(tr), tr.vocab_size, tr.num_classes, tr.seq_len) == (3, 257, 2, 8)
    assert tr.labels.tolist() == [0, 1, 1]  # neg = 0, pos = 1; numeric file order (1_9 before 10_8)
    assert tr[0]["inputs"].tolist() == [b + 1 for b in b"bad<br /"]
    assert tr[1]["inputs"].tolist() == [b + 1 for b in "très bi".encode()][:8]  # UTF-8 bytes: è is 2 ids
    assert tr[2]["inputs"].tolist() == [ord("o") + 1, ord("k") + 1] + [0] * 6
    val, test = D.load_text(tmp_path, "val"), D.load_lra("text", tmp_path, "test")
    assert val.labels.tolist() == test.labels.tolist() == [0, 1]
    assert all((a == b).all() for a, b in zip(val.inputs, test.inputs))


def test_missing_text_explains_imdb(tmp_path):
    with pytest.raises(DataMissingError, match="aclImdb"):
        D.load_text(tmp_path, "train")


# ------------------------------------------------------------------------------------------ Retrieval (AAN)


def test_retrieval_pairs_headerless_float_labels(tmp_path):
    d = tmp_path / "lra_release" / "tsv_data"
    lines = ['1.0\tP1\tP2\tabc "quoted\tdef', "0\tP3\tP4\tx\tyz"]
    for f in ("train", "eval", "test"):
        write_lines(d / f"new_aan_pairs.{f}.tsv", lines)
    ds = D.load_retrieval(tmp_path, "val", max_length=5)  # val reads the eval file
    assert ds.is_pair and (len(ds), ds.vocab_size, ds.num_classes) == (2, 257, 2)
    assert ds.labels.tolist() == [1, 0]
    item = ds[0]
    assert item["inputs"].tolist() == [b + 1 for b in b'abc "']  # no quote handling, truncated to 5
    assert item["inputs2"].tolist() == [b + 1 for b in b"def"] + [0, 0]
    assert ds.padded(2).shape == (2, 5)


@pytest.mark.parametrize("bad, words", [
    ("1\tP1\tP2\tonly four", "expected 5 tab-separated columns"),
    ("yes\tP1\tP2\ta\tb", "is not a number"),
    ("2.0\tP1\tP2\ta\tb", "is not 0 or 1"),
    ("0.5\tP1\tP2\ta\tb", "is not 0 or 1"),
])
def test_retrieval_malformed_names_file_and_line(tmp_path, bad, words):
    path = tmp_path / "tsv_data" / "new_aan_pairs.train.tsv"
    write_lines(path, ["0\tP1\tP2\ta\tb", "1\tP1\tP2\ta\tb", bad])
    with pytest.raises(DataError) as e:
        D.load_retrieval(tmp_path, "train")
    msg = str(e.value)
    assert "new_aan_pairs.train.tsv, line 3" in msg and words in msg, msg


def test_missing_retrieval_explains_release(tmp_path):
    with pytest.raises(DataMissingError, match=r"tsv_data/new_aan_pairs"):
        D.load_retrieval(tmp_path, "test")


# ------------------------------------------------------------------------------------------ Image (CIFAR-10)


def write_cifar(root, n_per_batch=10, seed=0):
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n_per_batch).tolist()
        with open(d / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * n_per_batch}, f)
        batches[name] = (data, labels)
    return batches


def test_grayscale_matches_tf_rgb_to_grayscale():
    rgb = np.array([[255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30], [0, 0, 0]], np.uint8)
    # tf: convert_image_dtype(uint8 -> float) / 255, weights (0.2989, 0.587, 0.114), * 255.5, truncating cast
    assert D.rgb_to_gray(rgb).tolist() == [255, 76, 149, 29, 18, 0]


def test_image_splits_and_pixels(tmp_path):
    batches = write_cifar(tmp_path)
    train, val, test = (D.load_image(tmp_path, s) for s in D.SPLITS)
    assert (len(train), len(val), len(test)) == (45, 5, 10)  # first 90% / last 10% / test_batch
    assert (train.seq_len, train.vocab_size, train.num_classes, train.pad_id) == (1024, 256, 10, None)
    data, labels = batches["data_batch_1"]
    x = data[3].reshape(3, 32, 32).astype(np.float64) / 255  # planes R, G, B, row-major
    ref = np.floor((0.2989 * x[0] + 0.587 * x[1] + 0.114 * x[2]) * 255.5).reshape(-1)
    assert np.abs(train[3]["inputs"].numpy() - ref).max() <= 1 and (train[3]["inputs"] >= 0).all()
    assert int(train[3]["label"]) == labels[3]
    assert val.labels.tolist() == batches["data_batch_5"][1][5:]
    assert test.labels.tolist() == batches["test_batch"][1]
    assert len(D.load_lra("image", tmp_path, "val", max_length=1024)) == 5
    with pytest.raises(ValueError, match="max_length must be None or 1024"):
        D.load_image(tmp_path, "train", max_length=512)


def test_image_malformed_pickle_names_file(tmp_path):
    write_cifar(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_2", "wb") as f:
        pickle.dump({b"labels": [1, 2], b"data": np.zeros((2, 100), np.uint8)}, f)
    with pytest.raises(DataError, match=r"data_batch_2: not a CIFAR-10 python pickle \('data' must be uint8 \[n, 3072\]"):
        D.load_image(tmp_path, "train")


def test_missing_image_explains_cifar(tmp_path):
    with pytest.raises(DataMissingError, match="cifar-10-batches-py"):
        D.load_image(tmp_path, "test")


# ----------------------------------------------------------------------------------------- Pathfinder reader


def write_pathfinder_release(root, n=20, blacklisted=True):
    """A tiny pathfinder32/curv_baseline in the release format (text metadata), with the known empty PNG."""
    task = root / "pathfinder32" / "curv_baseline"
    (task / "imgs" / "0").mkdir(parents=True)
    (task / "metadata").mkdir()
    rng = np.random.default_rng(0)
    last = "sample_172.png" if blacklisted else f"sample_{n - 1}.png"
    lines, names = [], [f"sample_{i}.png" for i in range(n - 1)] + [last]
    for i, name in enumerate(names):
        if name == "sample_172.png":
            (task / "imgs" / "0" / name).write_bytes(b"")
        else:
            Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8), mode="L").save(task / "imgs" / "0" / name)
        lines.append(f"imgs/0 {name} {i} {i % 2} 1.0 6 2 2 0.5 1 1")
    write_lines(task / "metadata" / "0.npy", lines)
    return task


def test_a_readable_image_named_like_the_release_s_empty_one_is_read(tmp_path):
    """Generated data may hold a good curv_baseline/imgs/0/sample_172.png: only empty files are skipped."""
    task = write_pathfinder_release(tmp_path, n=20, blacklisted=False)
    (task / "imgs" / "0" / "sample_19.png").rename(task / "imgs" / "0" / "sample_172.png")
    meta = task / "metadata" / "0.npy"
    meta.write_text(meta.read_text().replace("sample_19.png", "sample_172.png"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", D.LRADataWarning)
        parts = {s: D.load_pathfinder(tmp_path, s, difficulty="easy", seed=3) for s in D.SPLITS}
    assert sum(len(p) for p in parts.values()) == 20


def test_pathfinder_reader_split_and_blacklist(tmp_path):
    task = write_pathfinder_release(tmp_path)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        parts = {s: D.load_pathfinder(tmp_path, s, difficulty="easy", seed=3) for s in D.SPLITS}
    assert sum(len(p) for p in parts.values()) == 19  # 20 listed, the empty one skipped
    assert any(issubclass(x.category, D.LRADataWarning) and "sample_172.png" in str(x.message) for x in w)
    sizes = {s: len(D.pathfinder_split_indices(20, s, seed=3)) for s in D.SPLITS}
    assert sizes == {"train": 16, "val": 2, "test": 2}
    idx = np.concatenate([D.pathfinder_split_indices(20, s, seed=3) for s in D.SPLITS])
    assert sorted(idx.tolist()) == list(range(20))
    tr = parts["train"]
    assert (tr.seq_len, tr.vocab_size, tr.num_classes, tr.pad_id) == (1024, 256, 2, None)
    # pixels are the PNG's grey levels, row-major
    first = sorted(D.pathfinder_split_indices(20, "train", seed=3).tolist())[0]
    png = np.asarray(Image.open(task / "imgs" / "0" / f"sample_{first}.png")).reshape(-1)
    assert tr[0]["inputs"].tolist() == png.tolist() and int(tr[0]["label"]) == first % 2


def test_pathfinder_reader_skips_unreadable_png_and_reads_real_npy(tmp_path):
    task = write_pathfinder_release(tmp_path, n=10, blacklisted=False)
    (task / "imgs" / "0" / "sample_3.png").write_bytes(b"not a png")
    rows = np.array([["imgs/0", f"sample_{i}.png", str(i), str(i % 2)] for i in range(10)])
    (task / "metadata" / "0.npy").unlink()
    np.save(task / "metadata" / "0.npy", rows)  # the original generator's binary .npy
    with pytest.warns(D.LRADataWarning, match="sample_3.png"):
        got = [D.load_pathfinder(tmp_path, s, difficulty=6) for s in D.SPLITS]
    assert sum(len(g) for g in got) == 9


@pytest.mark.parametrize("line, words", [
    ("imgs/0 sample_1.png 1", "at least 4 space-separated columns"),
    ("imgs/0 sample_1.png 1 one", "is not an integer"),
    ("imgs/0 sample_1.png 1 3", "is not 0 or 1"),
])
def test_pathfinder_metadata_malformed_names_file_and_line(tmp_path, line, words):
    task = write_pathfinder_release(tmp_path, n=4)
    write_lines(task / "metadata" / "7.npy", ["imgs/0 sample_0.png 0 0 1.0 6", line])
    with pytest.raises(DataError) as e:
        D.load_pathfinder(tmp_path, "train", difficulty="easy")
    msg = str(e.value)
    assert "7.npy, line 2" in msg and words in msg, msg


def test_missing_pathfinder_explains_release_and_generator(tmp_path):
    with pytest.raises(DataMissingError) as e:
        D.load_pathfinder(tmp_path, "train")
    msg = str(e.value)
    assert "pathfinder32/curv_contour_length_14" in msg and "attnbench data pathfinder --out" in msg


# ------------------------------------------------------------------------------------- ListOps generator


def test_listops_generator_labels_bounds_and_reader(tmp_path):
    kw = dict(n_train=300, n_val=30, n_test=30, max_depth=10, max_args=10, min_length=20, max_length=120)
    paths = G.generate_listops(tmp_path, seed=0, **kw)
    assert paths["train"] == tmp_path / "listops-1000" / "basic_train.tsv"
    assert paths["train"].read_bytes().startswith(b"Source\tTarget\r\n")  # csv.writer, as LRA
    sources, labels = [], []
    for split in D.SPLITS:
        with open(paths[split], newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))[1:]
        assert len(rows) == kw[f"n_{split}"]
        for src, tgt in rows:
            value, length = listops_eval(src)
            assert value == int(tgt)  # MED = int(median), SM = sum % 10, ...
            assert kw["min_length"] < length < kw["max_length"]  # strict, as LRA
            sources.append(src)
            labels.append(int(tgt))
        ds = D.load_listops(tmp_path, split, max_length=kw["max_length"])
        assert len(ds) == kw[f"n_{split}"] and ds.lengths().max() < kw["max_length"]
    assert len(set(sources)) == len(sources)  # distinct across splits
    counts = np.bincount(labels, minlength=10)
    assert (counts > 0).all() and counts.max() < 0.5 * len(labels), counts
    # the fast whole-file tokeniser and the careful line-by-line one agree
    text = paths["train"].read_text()
    fast, careful = D._listops_fast(text, 50), D._listops_careful(paths["train"], text, 50)
    assert fast is not None and (fast[1] == careful[1]).all()
    assert all(np.array_equal(a, b) for a, b in zip(fast[0], careful[0]))


def test_listops_generator_deterministic_by_seed(tmp_path):
    kw = dict(n_train=40, n_val=5, n_test=5, min_length=10, max_length=64)
    a = G.generate_listops(tmp_path / "a", seed=7, **kw)
    b = G.generate_listops(tmp_path / "b", seed=7, **kw)
    c = G.generate_listops(tmp_path / "c", seed=8, **kw)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in D.SPLITS)
    assert a["train"].read_bytes() != c["train"].read_bytes()


def test_listops_generator_rejects_impossible_bounds():
    with pytest.raises(ValueError, match="no length satisfies"):
        G.generate_listops_examples(5, seed=0, min_length=10, max_length=11)
    with pytest.raises(ValueError, match="cannot reach"):
        G.generate_listops_examples(5, seed=0, max_depth=2, max_args=3, min_length=10, max_length=100)
    with pytest.raises(RuntimeError, match="distinct trees"):  # only a handful of 4-token trees exist
        G.generate_listops_examples(10_000, seed=0, max_depth=2, max_args=2, min_length=3, max_length=5,
                                    max_tries=20_000)


# ---------------------------------------------------------------------------------- Pathfinder generator


def markers_connected(sample, size, marker_radius, scale=8) -> bool:
    """Flood fill on a fine rendering of the generator's record: every contour's centre line (gaps included)
    and the two marker discs. True iff one region holds both markers."""
    n = size * scale
    im = Image.new("L", (n, n), 0)
    draw = ImageDraw.Draw(im)
    for poly in sample.contours:
        draw.line([tuple(v * scale) for v in poly], fill=255, width=3)
    r = marker_radius * scale
    for x, y in sample.markers * scale:
        draw.ellipse([x - r, y - r, x + r, y + r], fill=255)
    ImageDraw.floodfill(im, tuple(sample.markers[0] * scale), 128)
    return im.getpixel(tuple(sample.markers[1] * scale)) == 128


@pytest.mark.parametrize("contour_length", [14, 6])
def test_pathfinder_markers_connected_iff_label_1(contour_length):
    p = G.pathfinder_params(size=32, contour_length=contour_length)
    rng = np.random.default_rng(contour_length)
    for i in range(24):
        s = G.sample_pathfinder(rng, p, label=i % 2)
        assert s.kinds[:2] == ["target", "target"] and s.image.shape == (32, 32) and s.image.dtype == np.uint8
        assert all(len(c) == 3 * contour_length - 1 for c in s.contours[:2])  # contour_length paddles each
        first, second = s.marker_contours
        assert (first == second) == bool(s.label)
        assert np.allclose(s.markers[0], s.contours[first][0]) and np.allclose(s.markers[1], s.contours[second][-1])
        assert markers_connected(s, 32, p.marker_radius) == bool(s.label), (i, s.label)
        # the picture shows what the record says: bright markers, every paddle inked near its midpoint
        assert all(s.image[int(y), int(x)] >= 250 for x, y in s.markers)
        pad = np.pad(s.image, 1)
        for c in s.contours:
            mid = ((c[0::3] + c[1::3]) / 2).astype(int) + 1
            near = np.max([pad[mid[:, 1] + dy, mid[:, 0] + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)
            assert near.min() > 30


def test_pathfinder_generator_layout_balance_and_reader(tmp_path):
    n = 100
    root = G.generate_pathfinder(tmp_path, n=n, seed=0, contour_length=14, images_per_dir=40)
    assert root == tmp_path / "pathfinder32" / "curv_contour_length_14"
    assert sorted(p.name for p in (root / "metadata").iterdir()) == ["0.npy", "1.npy", "2.npy"]
    line = (root / "metadata" / "2.npy").read_text().splitlines()[0].split(" ")
    assert line[:3] == ["imgs/2", "sample_0.png", "0"] and line[3] in ("0", "1") and line[5] == "14"
    with Image.open(root / "imgs" / "2" / "sample_19.png") as im:
        assert im.mode == "L" and im.size == (32, 32)
    parts = [D.load_pathfinder(tmp_path, s, difficulty="hard", seed=1) for s in D.SPLITS]
    assert [len(p) for p in parts] == [80, 10, 10]
    labels = np.concatenate([p.labels for p in parts])
    assert abs(labels.mean() - 0.5) <= 0.02  # balanced within every directory
    assert D.load_lra("pathfinder", tmp_path, "val", difficulty=14, seed=1).labels.tolist() == parts[1].labels.tolist()


def test_pathfinder_generator_deterministic_by_seed_and_difficulty_dirs(tmp_path):
    a = G.generate_pathfinder(tmp_path / "a", n=8, seed=5, contour_length=6)
    b = G.generate_pathfinder(tmp_path / "b", n=8, seed=5, contour_length=6)
    c = G.generate_pathfinder(tmp_path / "c", n=8, seed=6, contour_length=6)
    assert a.name == "curv_baseline"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 9
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert any((a / f).read_bytes() != (c / f).read_bytes() for f in files)
    assert G.pathfinder_dirname(9) == "curv_contour_length_9" == D.pathfinder_dir_name("intermediate")
    assert len(D.load_pathfinder(tmp_path / "a", "train", difficulty="easy")) == 6
