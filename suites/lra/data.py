"""Readers for the Long Range Arena tasks, in the file formats of the LRA release (offline, no hub).

Every reader returns a :class:`TokenDataset`: token-id sequences (truncated to ``max_length``), integer labels
and the facts a model needs (``vocab_size``, ``num_classes``, ``pad_id``, ``seq_len``). Items come out padded
to ``seq_len`` as int64 tensors, so a ``torch.utils.data.DataLoader`` batches them with the default collate.

Tasks, files (under ``root``, ``root/lra_release`` or ``root/lra_release/lra_release``) and tokens, following
``google-research/long-range-arena``'s input pipelines:

- listops: ``listops-1000/basic_{train,val,test}.tsv``; fixed 16-token vocabulary (pad 0); 10 classes.
- text: ``aclImdb/{train,test}/{pos,neg}/*.txt``; bytes + 1 (pad 0, vocab 257); 2 classes.
- retrieval: ``tsv_data/new_aan_pairs.{train,eval,test}.tsv``; bytes + 1, document pairs; 2 classes.
- image: ``cifar-10-batches-py/{data_batch_1..5,test_batch}``; grey levels 0..255, length 1024; 10 classes.
- pathfinder: ``pathfinder32/curv_*/{imgs/<k>/sample_<i>.png,metadata/<k>.npy}``; grey levels, 1024; 2 classes.

Splits are ``"train"``, ``"val"``, ``"test"``. As in LRA: the text task validates on the IMDb *test* split
(IMDb has no validation split); image is train[:90%] / train[90%:] / test; pathfinder is an 80/10/10 split of
the shuffled examples (fixed ``seed``); retrieval's ``"val"`` is the ``eval`` file.
"""

from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import torch

from attnbench.core.errors import DataError, DataMissingError
from attnbench.io.formats import read_cifar_batch as read_cifar_rgb
from attnbench.core.protocol import UnknownNameError

PathLike = Union[str, "os.PathLike[str]"]

SPLITS = ("train", "val", "test")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder")

#: Prefixes tried under ``root``: the release archive unpacks to ``lra_release/lra_release/...``.
RELEASE_PREFIXES = ("", "lra_release", os.path.join("lra_release", "lra_release"))
RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"


# --------------------------------------------------------------------------------------------------- errors


class LRADataWarning(UserWarning):
    """Examples skipped while reading (e.g. the known empty Pathfinder PNG)."""


# ---------------------------------------------------------------------------------------------- the dataset


@dataclass(eq=False)
class TokenDataset(torch.utils.data.Dataset):
    """An in-memory LRA split: token-id sequences and labels.

    ``inputs[i]`` is a 1-D integer array of length ``<= seq_len`` (already truncated); ``inputs`` may also be one
    2-D array ``[n, seq_len]`` (pixel tasks). ``inputs2`` holds the second document of a retrieval pair.
    ``pad_id`` is ``None`` for fixed-length tasks whose every id is data (pixels 0..255), in which case every
    sequence must be exactly ``seq_len`` long.

    ``ds[i]`` is ``{"inputs": LongTensor [seq_len], "label": LongTensor []}`` (plus ``"inputs2"`` for pairs).
    """

    name: str
    inputs: Sequence[np.ndarray] = field(repr=False)
    labels: np.ndarray = field(repr=False)  # [n] int64
    seq_len: int
    vocab_size: int
    num_classes: int
    pad_id: Optional[int] = 0
    inputs2: Optional[Sequence[np.ndarray]] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        n = len(self.labels)
        if len(self.inputs) != n:
            raise ValueError(f"{self.name}: {len(self.inputs)} inputs but {n} labels")
        if self.inputs2 is not None and len(self.inputs2) != n:
            raise ValueError(f"{self.name}: {len(self.inputs2)} inputs2 but {n} labels")
        if n and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise ValueError(f"{self.name}: labels outside 0..{self.num_classes - 1}")
        for which in (1, 2) if self.inputs2 is not None else (1,):
            lens = self.lengths(which)
            if n and lens.max() > self.seq_len:
                raise ValueError(f"{self.name}: a sequence of length {lens.max()} exceeds seq_len={self.seq_len}")
            if n and self.pad_id is None and lens.min() != self.seq_len:
                raise ValueError(f"{self.name}: fixed-length task (pad_id=None) needs every sequence of length "
                                 f"{self.seq_len}; found {lens.min()}")

    @property
    def is_pair(self) -> bool:
        return self.inputs2 is not None

    def __len__(self) -> int:
        return len(self.labels)

    def _pad(self, seq: np.ndarray) -> torch.Tensor:
        out = torch.full((self.seq_len,), 0 if self.pad_id is None else self.pad_id, dtype=torch.int64)  # [L]
        out[: len(seq)] = torch.from_numpy(np.asarray(seq, dtype=np.int64))
        return out

    def __getitem__(self, i: int) -> dict:
        item = {"inputs": self._pad(self.inputs[i]), "label": torch.tensor(int(self.labels[i]))}
        if self.inputs2 is not None:
            item["inputs2"] = self._pad(self.inputs2[i])
        return item

    def lengths(self, which: int = 1) -> np.ndarray:
        """Unpadded length of every sequence, ``[n]`` int64 (``which=2``: the second document of a pair)."""
        seqs = self.inputs if which == 1 else self.inputs2
        if seqs is None:
            raise ValueError(f"{self.name} has no inputs2 (not a pair task)")
        if isinstance(seqs, np.ndarray) and seqs.ndim == 2:
            return np.full(len(seqs), seqs.shape[1], dtype=np.int64)
        return np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))

    def padded(self, which: int = 1) -> torch.Tensor:
        """All sequences as one padded tensor ``[n, seq_len]`` int64 (mind the memory on full-size splits)."""
        seqs = self.inputs if which == 1 else self.inputs2
        if seqs is None:
            raise ValueError(f"{self.name} has no inputs2 (not a pair task)")
        if isinstance(seqs, np.ndarray) and seqs.ndim == 2:
            return torch.from_numpy(seqs.astype(np.int64))
        out = torch.full((len(seqs), self.seq_len), 0 if self.pad_id is None else self.pad_id, dtype=torch.int64)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.int64))
        return out

    def subset(self, indices: Iterable[int], name: Optional[str] = None) -> "TokenDataset":
        """The examples at ``indices`` (e.g. a small random sample for a tiny setting)."""
        idx = np.asarray(list(indices), dtype=np.int64)

        def take(seqs):
            if seqs is None:
                return None
            if isinstance(seqs, np.ndarray) and seqs.ndim == 2:
                return seqs[idx]
            return [seqs[i] for i in idx]

        return TokenDataset(name=name or self.name, inputs=take(self.inputs), labels=self.labels[idx],
                            seq_len=self.seq_len, vocab_size=self.vocab_size, num_classes=self.num_classes,
                            pad_id=self.pad_id, inputs2=take(self.inputs2))

    def label_counts(self) -> np.ndarray:
        """How many examples of each class, ``[num_classes]``."""
        return np.bincount(self.labels, minlength=self.num_classes)


# ------------------------------------------------------------------------------------------------- helpers


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def _check_max_length(max_length: int) -> int:
    if not isinstance(max_length, (int, np.integer)) or isinstance(max_length, bool) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    return int(max_length)


def _find(root: PathLike, candidates: Sequence[str], task: str, hint: str) -> Path:
    """The first ``root/<prefix>/<candidate>`` that exists; otherwise a :class:`DataMissingError`."""
    root = Path(root)
    if not root.is_dir():
        raise DataMissingError(f"LRA {task} data not found: {str(root)!r} is not a directory\n{hint}")
    tried = []
    for prefix in RELEASE_PREFIXES:
        for cand in candidates:
            p = root / prefix / cand if prefix else root / cand
            if p.exists():
                return p
            tried.append(str(p))
    raise DataMissingError(
        f"LRA {task} data not found under {str(root)!r} (looked for {' or '.join(candidates)} in it and in its "
        f"lra_release/ subfolders)\nLooked for:\n  " + "\n  ".join(tried) + f"\n{hint}")


def _release_hint(what: str, generate: Optional[str] = None) -> str:
    msg = (f"Put the LRA release there: download {RELEASE_URL}, unpack it and point root at the directory "
           f"holding lra_release/ (the files are lra_release/lra_release/{what}).")
    if generate:
        msg += f" Or generate synthetic data in the same layout: `attnbench data {generate} --out DIR`."
    return msg


def bytes_to_ids(data: bytes, max_length: int) -> np.ndarray:
    """Byte-level tokens as LRA's ``ByteTextEncoder``: id = byte + 1 (0 is padding); ``[min(len, max_length)]``."""
    return np.frombuffer(data[:max_length], dtype=np.uint8).astype(np.int16) + 1


BYTE_VOCAB_SIZE = 257  # 256 byte values + pad


# ------------------------------------------------------------------------------------------------- ListOps

#: Fixed ListOps vocabulary. Id 0 is padding; the file's ``]`` is read as ``X`` (LRA's rewrite: its tokenizer
#: dropped non-alphanumerics) and ``(`` / ``)`` are deleted, then the source is split on whitespace.
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + ("[MIN", "[MAX", "[MED", "[SM", "X")
LISTOPS_PAD_ID = 0
_LISTOPS_ID = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
# Fast path: each multi-character operator becomes one control character, so every token is one character.
_LISTOPS_OPS = (("[MIN", "\x01"), ("[MAX", "\x02"), ("[MED", "\x03"), ("[SM", "\x04"))
_LISTOPS_LUT = np.full(256, -1, dtype=np.int16)
for _tok, _i in _LISTOPS_ID.items():
    if len(_tok) == 1:
        _LISTOPS_LUT[ord(_tok)] = _i
for _tok, _c in _LISTOPS_OPS:
    _LISTOPS_LUT[ord(_c)] = _LISTOPS_ID[_tok]


def listops_tokenize(source: str) -> np.ndarray:
    """One ListOps ``Source`` string -> token ids ``[n_tokens]`` int16 (raises ``KeyError(token)`` if unknown)."""
    s = source.replace("(", "").replace(")", "").replace("]", "X")
    if not any(c in s for _, c in _LISTOPS_OPS):
        fast = s
        for tok, c in _LISTOPS_OPS:
            fast = fast.replace(tok, c)
        toks = fast.split()
        joined = "".join(toks)
        if len(joined) == len(toks) and joined.isascii():
            ids = _LISTOPS_LUT[np.frombuffer(joined.encode("ascii"), dtype=np.uint8)]
            if ids.size == 0 or ids.min() >= 0:
                return ids
    # slow path: find and name the offending token
    out = []
    for tok in s.split():
        if tok not in _LISTOPS_ID or tok == "<pad>":
            raise KeyError(tok)
        out.append(_LISTOPS_ID[tok])
    return np.asarray(out, dtype=np.int16)


def read_listops_tsv(path: PathLike, max_length: int = 2000) -> tuple[list[np.ndarray], np.ndarray]:
    """A ``Source\tTarget`` file -> (token-id arrays, each ``[<= max_length]``; labels ``[n]``).

    Malformed content raises :class:`DataError` naming the file and line.
    """
    path = Path(path)
    max_length = _check_max_length(max_length)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text ({e})", path=path) from None
    fast = _listops_fast(text, max_length)
    return fast if fast is not None else _listops_careful(path, text, max_length)


_LISTOPS_BRACKET = bytes.maketrans(b"]", b"X")


def _listops_fast(text: str, max_length: int):
    """Whole-file tokenisation for well-formed files; ``None`` at the first doubt (the careful reader then
    finds and names the problem).

    After the rewrites every token (and every Target digit) is one character between blanks, so the file becomes
    one byte array: drop the blanks, check each row is ``tokens TAB digit``, look all tokens up at once.
    """
    if any(c in text for _, c in _LISTOPS_OPS) or not text.isascii():
        return None
    # bytes.translate deletes and maps in one C pass (str.replace is several times slower here)
    body = text.encode("ascii").replace(b"\r\n", b"\n").translate(_LISTOPS_BRACKET, b"()")
    header, _, body = body.partition(b"\n")
    if header != b"Source\tTarget":
        return None
    for tok, c in _LISTOPS_OPS:
        body = body.replace(tok.encode(), c.encode())
    b = np.frombuffer(body + b"\n", dtype=np.uint8)  # [chars]
    nl, tab = b == 10, b == 9
    solid = ~(nl | tab | (b == 32))
    if (solid[1:] & solid[:-1]).any() or np.isin(b, (11, 12, 13, 28, 29, 30, 31)).any():
        return None  # a token longer than one character, or other whitespace: let the careful reader decide
    c = b[solid | nl | tab]
    keep = np.ones(len(c), dtype=bool)
    keep[1:] = ~((c[1:] == 10) & (c[:-1] == 10))  # blank lines
    keep[0] = c[0] != 10
    c = c[keep]  # rows "t t t ... TAB d NL"
    ends = np.flatnonzero(c == 10)  # [rows]
    tabs = np.flatnonzero(c == 9)
    if len(ends) == 0 or len(tabs) != len(ends) or (tabs != ends - 2).any():
        return None
    starts = np.concatenate([[0], ends[:-1] + 1])
    labels = c[ends - 1].astype(np.int64) - 48  # [rows]
    lens = tabs - starts  # [rows]
    if (labels < 0).any() or (labels > 9).any() or (lens < 1).any():
        return None
    tok = np.ones(len(c), dtype=bool)
    tok[ends] = tok[tabs] = tok[ends - 1] = False
    ids = _LISTOPS_LUT[c[tok]]  # [tokens]
    if ids.size and ids.min() < 0:
        return None
    offs = np.concatenate([[0], np.cumsum(lens)]).tolist()
    inputs = [ids[o: min(o2, o + max_length)] for o, o2 in zip(offs[:-1], offs[1:])]
    return inputs, labels


def _listops_careful(path: Path, text: str, max_length: int) -> tuple[list[np.ndarray], np.ndarray]:
    inputs, labels = [], []
    lines = text.split("\n")  # (read_text already turned \r\n into \n; splitlines would split on more)
    header = lines[0]
    if header.split("\t") != ["Source", "Target"]:
        raise DataError(f"expected the header 'Source<TAB>Target', found {header[:60]!r}", path=path, line=1)
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2:
            raise DataError(f"expected 2 tab-separated columns (Source, Target), found {len(cols)}",
                               path=path, line=lineno)
        source, target = cols
        try:
            label = int(target.strip())
        except ValueError:
            raise DataError(f"Target {target!r} is not an integer", path=path, line=lineno) from None
        if not 0 <= label <= 9:
            raise DataError(f"Target {label} is outside 0..9", path=path, line=lineno)
        try:
            ids = listops_tokenize(source)
        except KeyError as e:
            raise DataError(f"unknown ListOps token {e.args[0]!r} (vocabulary: {LISTOPS_VOCAB[1:]})",
                               path=path, line=lineno) from None
        if ids.size == 0:
            raise DataError("empty Source", path=path, line=lineno)
        inputs.append(ids[:max_length])
        labels.append(label)
    return inputs, np.asarray(labels, dtype=np.int64)


def load_listops(root: PathLike, split: str, *, max_length: int = 2000, task: str = "basic") -> TokenDataset:
    """ListOps ``listops-1000/{task}_{split}.tsv`` -> ``TokenDataset`` (vocab 16, pad 0, 10 classes)."""
    _check_split(split)
    d = _find(root, ["listops-1000"], "listops", _release_hint("listops-1000/basic_{train,val,test}.tsv", "listops"))
    path = d / f"{task}_{split}.tsv"
    if not path.is_file():
        raise DataMissingError(f"ListOps file {str(path)!r} is missing. "
                                  + _release_hint("listops-1000/basic_{train,val,test}.tsv", "listops"))
    inputs, labels = read_listops_tsv(path, max_length)
    return TokenDataset(name=f"listops/{split}", inputs=inputs, labels=labels, seq_len=max_length,
                        vocab_size=len(LISTOPS_VOCAB), num_classes=10, pad_id=LISTOPS_PAD_ID)


# ---------------------------------------------------------------------------------------------- Text (IMDb)

_IMDB_HINT = ("The text task reads the IMDb release: download aclImdb_v1.tar.gz "
              "(https://ai.stanford.edu/~amaas/data/sentiment/, the archive tfds' imdb_reviews is built from) and "
              "unpack it so that ROOT/aclImdb/{train,test}/{pos,neg}/*.txt exist.")


def _imdb_key(p: Path):
    stem = p.stem.split("_")
    try:
        return (0, int(stem[0]), int(stem[1]) if len(stem) > 1 else 0, p.name)
    except ValueError:
        return (1, 0, 0, p.name)


def load_text(root: PathLike, split: str, *, max_length: int = 4000) -> TokenDataset:
    """IMDb reviews, byte level -> ``TokenDataset`` (vocab 257, pad 0; neg = 0, pos = 1).

    ``"val"`` is the IMDb test split, as in LRA. ``max_length`` is 4000 in the LRA paper, 1000 in the LRA repo's
    ``base_tc_config`` (record the setting). Examples come in file order: all ``neg`` then all ``pos``.
    """
    _check_split(split)
    max_length = _check_max_length(max_length)
    root = Path(root)
    base = root if (root / "train").is_dir() and (root / "test").is_dir() and root.name == "aclImdb" else None
    if base is None:
        base = _find(root, ["aclImdb"], "text", _IMDB_HINT)
    sub = "train" if split == "train" else "test"
    inputs, labels = [], []
    for label, cls in enumerate(("neg", "pos")):
        d = base / sub / cls
        if not d.is_dir():
            raise DataMissingError(f"IMDb directory {str(d)!r} is missing. {_IMDB_HINT}")
        files = sorted(d.glob("*.txt"), key=_imdb_key)
        if not files:
            raise DataMissingError(f"IMDb directory {str(d)!r} holds no *.txt reviews. {_IMDB_HINT}")
        for p in files:
            inputs.append(bytes_to_ids(p.read_bytes(), max_length))
            labels.append(label)
    return TokenDataset(name=f"text/{split}", inputs=inputs, labels=np.asarray(labels), seq_len=max_length,
                        vocab_size=BYTE_VOCAB_SIZE, num_classes=2, pad_id=0)


# ------------------------------------------------------------------------------------------ Retrieval (AAN)

_AAN_FILES = {"train": "train", "val": "eval", "test": "test"}
AAN_MAX_BYTES = 10000  # LRA's matching pipeline cuts each document to 10,000 bytes before encoding


def read_aan_tsv(path: PathLike, max_length: int = 4000) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """A headerless ``label\\tid1\\tid2\\ttext1\\ttext2`` file -> (ids of text1, ids of text2, labels ``[n]``).

    No quote handling (LRA reads it with ``use_quote_delim=False``); the label is read as a float, then cast
    to int, and must be 0 or 1.
    """
    path = Path(path)
    max_length = _check_max_length(max_length)
    cut = min(max_length, AAN_MAX_BYTES)
    in1, in2, labels = [], [], []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            cols = line.split(b"\t")
            if len(cols) != 5:
                raise DataError(f"expected 5 tab-separated columns (label, id1, id2, text1, text2), "
                                   f"found {len(cols)}", path=path, line=lineno)
            try:
                value = float(cols[0])
            except ValueError:
                label = cols[0][:40].decode("utf-8", "replace")
                raise DataError(f"label {label!r} is not a number", path=path, line=lineno) from None
            if not math.isfinite(value) or value != int(value) or int(value) not in (0, 1):
                raise DataError(f"label {value} is not 0 or 1", path=path, line=lineno)
            in1.append(bytes_to_ids(cols[3], cut))
            in2.append(bytes_to_ids(cols[4], cut))
            labels.append(int(value))
    return in1, in2, np.asarray(labels, dtype=np.int64)


def load_retrieval(root: PathLike, split: str, *, max_length: int = 4000) -> TokenDataset:
    """AAN document pairs ``new_aan_pairs.{train,eval,test}.tsv``, byte level -> paired ``TokenDataset``."""
    _check_split(split)
    name = f"new_aan_pairs.{_AAN_FILES[split]}.tsv"
    path = _find(root, [os.path.join("tsv_data", name), name], "retrieval",
                 _release_hint("tsv_data/new_aan_pairs.{train,eval,test}.tsv"))
    in1, in2, labels = read_aan_tsv(path, max_length)
    return TokenDataset(name=f"retrieval/{split}", inputs=in1, inputs2=in2, labels=labels, seq_len=max_length,
                        vocab_size=BYTE_VOCAB_SIZE, num_classes=2, pad_id=0)


# ------------------------------------------------------------------------------------------ Image (CIFAR-10)

_CIFAR_HINT = ("The image task reads CIFAR-10's python release: download cifar-10-python.tar.gz "
               "(https://www.cs.toronto.edu/~kriz/cifar.html) and unpack it so that ROOT/cifar-10-batches-py/ "
               "exists (torchvision.datasets.CIFAR10(root=ROOT, download=True) on a networked machine makes the "
               "same directory).")
#: ``tf.image.rgb_to_grayscale`` weights.
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)


def rgb_to_gray(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` uint8 -> ``[...]`` uint8 exactly as ``tf.image.rgb_to_grayscale`` on uint8 then int cast.

    TF: x / 255 in float32, weighted sum, then ``* 255.5`` and a truncating cast back to uint8.
    """
    x = rgb.astype(np.float32) * np.float32(1.0 / 255.0)  # [..., 3]
    w = np.asarray(GRAY_WEIGHTS, dtype=np.float32)
    gray = x[..., 0] * w[0] + x[..., 1] * w[1] + x[..., 2] * w[2]  # [...]
    return np.trunc(gray * np.float32(255.5)).astype(np.uint8)


def read_cifar_batch(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python pickle (read by :func:`attnbench.io.formats.read_cifar_batch`) -> (grey images ``[n, 1024]``
    uint8, labels ``[n]`` int64)."""
    rgb, labels = read_cifar_rgb(path, which=10)  # [n, 32, 32, 3], [n]
    return rgb_to_gray(rgb.reshape(len(rgb), 1024, 3)), labels


def _check_pixels_length(max_length: Optional[int], n: int, task: str) -> None:
    if max_length is not None and max_length != n:
        raise ValueError(f"{task} sequences are the {n} pixels of an image (no truncation or padding in LRA); "
                         f"max_length must be None or {n}, got {max_length!r}")


def load_image(root: PathLike, split: str, *, max_length: Optional[int] = None) -> TokenDataset:
    """Grey CIFAR-10 -> ``TokenDataset`` of pixel tokens 0..255 (vocab 256, length 1024, no padding).

    train = the first 90% of the training batches (in file order), val = the last 10%, test = ``test_batch``.
    (LRA slices tfds' copy, whose example order is tfds' own, so the exact 45K/5K membership differs.)
    """
    _check_split(split)
    _check_pixels_length(max_length, 1024, "image")
    d = _find(root, ["cifar-10-batches-py"], "image", _CIFAR_HINT)
    names = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise DataMissingError(f"CIFAR-10 files {missing} missing from {str(d)!r}. {_CIFAR_HINT}")
    parts = [read_cifar_batch(d / n) for n in names]
    x = np.concatenate([p[0] for p in parts])  # [N, 1024]
    y = np.concatenate([p[1] for p in parts])  # [N]
    if split != "test":
        cut = int(round(0.9 * len(x)))
        x, y = (x[:cut], y[:cut]) if split == "train" else (x[cut:], y[cut:])
    return TokenDataset(name=f"image/{split}", inputs=x, labels=y, seq_len=1024, vocab_size=256,
                        num_classes=10, pad_id=None)


# ---------------------------------------------------------------------------------------------- Pathfinder

#: LRA split names -> directory names.
PATHFINDER_DIRS = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9",
                   "hard": "curv_contour_length_14"}
PATHFINDER_SPLIT = (0.8, 0.1, 0.1)


def pathfinder_dir_name(difficulty: Union[str, int]) -> str:
    """``"easy"|"intermediate"|"hard"``, a contour length (6, 9, 14) or a directory name -> directory name."""
    if isinstance(difficulty, (int, np.integer)):
        return "curv_baseline" if int(difficulty) == 6 else f"curv_contour_length_{int(difficulty)}"
    if difficulty in PATHFINDER_DIRS:
        return PATHFINDER_DIRS[difficulty]
    if str(difficulty).startswith("curv_"):
        return str(difficulty)
    raise ValueError(f"pathfinder difficulty must be one of {tuple(PATHFINDER_DIRS)}, a contour length or a "
                     f"curv_* directory name, got {difficulty!r}")


def read_pathfinder_metadata(path: PathLike) -> list[tuple[str, str, int]]:
    """One ``metadata/<k>.npy`` -> ``[(subdir, file name, label)]``.

    The release's files are text despite the suffix: one example per line, space-separated, ``[0]`` subdir
    (``imgs/<k>``), ``[1]`` file name, ``[3]`` label. A real ``.npy`` string array (what the original generator's
    ``np.save`` writes) is read too.
    """
    path = Path(path)
    raw = path.read_bytes()
    rows: list[tuple[int, list[str]]] = []
    if raw.startswith(b"\x93NUMPY"):
        import io
        try:
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
        except ValueError as e:
            raise DataError(f"unreadable .npy metadata ({e})", path=path) from None
        rows = [(i + 1, [str(v) for v in np.atleast_1d(r)]) for i, r in enumerate(np.atleast_2d(arr))]
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"metadata is neither text nor .npy ({e})", path=path) from None
        rows = [(i, line.split()) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    out = []
    for lineno, cols in rows:
        if len(cols) < 4:
            raise DataError(f"expected at least 4 space-separated columns (subdir, file, index, label), "
                               f"found {len(cols)}", path=path, line=lineno)
        try:
            label = int(cols[3])
        except ValueError:
            raise DataError(f"label (column 4) {cols[3]!r} is not an integer", path=path, line=lineno) from None
        if label not in (0, 1):
            raise DataError(f"label (column 4) {label} is not 0 or 1", path=path, line=lineno)
        out.append((cols[0], cols[1], label))
    return out


def _meta_key(p: Path):
    return (0, int(p.stem), p.name) if p.stem.isdigit() else (1, 0, p.name)


def read_png_tokens(path: PathLike, resolution: int) -> Optional[np.ndarray]:
    """A grey PNG -> pixels ``[resolution * resolution]`` uint8, or ``None`` if the file is empty/unreadable."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return None
        with Image.open(path) as im:
            im.load()
            if im.mode != "L":
                im = im.convert("L")
            arr = np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
        return None
    if arr.shape != (resolution, resolution):
        raise DataError(f"image is {arr.shape[1]}x{arr.shape[0]}, expected {resolution}x{resolution}", path=path)
    return arr.reshape(-1)


def pathfinder_split_indices(n: int, split: str, seed: int = 0) -> np.ndarray:
    """Indices of ``split`` in an 80/10/10 split of ``n`` examples shuffled with ``seed``."""
    perm = np.random.default_rng(seed).permutation(n)
    a = int(PATHFINDER_SPLIT[0] * n)
    b = int((PATHFINDER_SPLIT[0] + PATHFINDER_SPLIT[1]) * n)
    return {"train": perm[:a], "val": perm[a:b], "test": perm[b:]}[_check_split(split)]


def load_pathfinder(root: PathLike, split: str, *, resolution: int = 32, difficulty: Union[str, int] = "hard",
                    seed: int = 0, max_length: Optional[int] = None) -> TokenDataset:
    """Pathfinder ``pathfinder{res}/<difficulty dir>`` -> ``TokenDataset`` of pixel tokens (length res*res).

    Reads every ``metadata/*.npy`` (in numeric order), shuffles the examples with ``seed``, takes the 80/10/10
    slice for ``split`` and decodes only those PNGs. Empty or unreadable PNGs (the release has
    ``pathfinder32/curv_baseline/imgs/0/sample_172.png``) are skipped with one :class:`LRADataWarning`.
    LRA's standard "Pathfinder" is ``difficulty="hard"`` (contour length 14); Path-X is resolution 128.
    """
    _check_split(split)
    _check_pixels_length(max_length, resolution * resolution, "pathfinder")
    dirname = pathfinder_dir_name(difficulty)
    rel = f"pathfinder{resolution}/{dirname}"
    task_dir = _find(root, [rel], "pathfinder", _release_hint(f"{rel}/{{imgs,metadata}}", "pathfinder"))
    meta_dir = task_dir / "metadata"
    metas = sorted(meta_dir.glob("*.npy"), key=_meta_key) if meta_dir.is_dir() else []
    if not metas:
        raise DataMissingError(f"no metadata/*.npy files in {str(task_dir)!r}. "
                                  + _release_hint(f"{rel}/metadata/<k>.npy", "pathfinder"))
    examples = [ex for m in metas for ex in read_pathfinder_metadata(m)]
    if not examples:
        raise DataError("the metadata files list no examples", path=meta_dir)
    pixels, labels, skipped = [], [], []
    for i in np.sort(pathfinder_split_indices(len(examples), split, seed)):
        subdir, fname, label = examples[i]
        key = f"{rel}/{subdir}/{fname}"
        # None for an empty or unreadable file, e.g. the release's known-empty curv_baseline sample_172.png (s4's
        # blacklist); judged by the file itself, so generated data with that name is read like any other
        arr = read_png_tokens(task_dir / subdir / fname, resolution)
        if arr is None:
            skipped.append(key)
            continue
        pixels.append(arr)
        labels.append(label)
    if skipped:
        warnings.warn(f"pathfinder {split}: skipped {len(skipped)} empty, missing or unreadable image(s): "
                      + ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""), LRADataWarning,
                      stacklevel=2)
    if not pixels:
        raise DataError(f"no readable images for split {split!r}", path=task_dir)
    x = np.stack(pixels)  # [n, res*res]
    return TokenDataset(name=f"pathfinder{resolution}-{dirname}/{split}", inputs=x, labels=np.asarray(labels),
                        seq_len=resolution * resolution, vocab_size=256, num_classes=2, pad_id=None)


# ------------------------------------------------------------------------------------------------ dispatch

_LOADERS = {"listops": load_listops, "text": load_text, "retrieval": load_retrieval, "image": load_image,
            "pathfinder": load_pathfinder}


def load_lra(task: str, root: PathLike, split: str, **options) -> TokenDataset:
    """``load_<task>(root, split, **options)`` by name: listops, text, retrieval, image, pathfinder."""
    if task not in _LOADERS:
        close = difflib.get_close_matches(str(task), TASKS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownNameError(f"unknown LRA task {task!r}: known tasks are {', '.join(TASKS)}{hint}")
    return _LOADERS[task](root, split, **options)
