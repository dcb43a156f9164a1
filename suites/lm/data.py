"""Corpora, tokenizers and packed token windows for the LM suite.

Sources (``DataConfig.source``), all read through Hugging Face ``datasets`` except the stdlib one:

- ``stdlib``: the Python standard library's own source files (``sysconfig``'s ``stdlib`` path, ``*.py``, no
  ``site-packages``): a real corpus present on every machine with Python, hence the offline default. It differs
  between Python versions, so the corpus description and fingerprint name the version and the files.
- ``files``: local text (``.txt``: one document per file), JSONL / JSON or Parquet (a ``text_field`` per record)
  files, by path or glob, through ``datasets.load_dataset("text" | "json" | "parquet", data_files=...)``.
- ``hub``: a hub corpus by name (``cerebras/SlimPajama-627B``, ``HuggingFaceFW/fineweb-edu`` with a ``name``
  such as ``sample-10BT``), streamed (``datasets.load_dataset(..., streaming=True)``) until the byte budget.

Documents are split into train / validation / test by a hash of their identity (file path or text), so the split
does not depend on reading order. Tokenizers: ``bpe`` (a byte-level BPE of ``vocab_size`` trained here on the
train split with the ``tokenizers`` library), ``bytes`` (byte-level, 256 symbols + end of text), or a hub name /
local path (``transformers.AutoTokenizer``, its fast ``tokenizers`` form is what the artifact keeps). Each split
is tokenised once, documents joined by the end-of-text token, and kept as a flat ``uint16`` / ``uint32`` array
under the work directory (keyed by the corpus and tokenizer fingerprint); training windows are ``seq_len + 1``
tokens at stride ``seq_len`` (every token is a target once per epoch).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Iterator

import numpy as np

from attnbench.core.errors import DataError  # a corpus that cannot be read (the message names it and what to do)

SOURCES = ("stdlib", "files", "hub")
EOT = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "stdlib"
    path: str = ""                 # files: paths or globs, comma-separated; hub: the dataset name
    name: str = ""                 # hub: the dataset configuration (e.g. "sample-10BT")
    split: str = "train"           # files / hub: the split read (documents are re-split by hash)
    text_field: str = "text"
    tokenizer: str = "bpe"         # "bpe" (trained here), "bytes", or a hub name / local path
    vocab_size: int = 2048         # "bpe": trained to this size; a hub tokenizer: its size (used by --smoke)
    seq_len: int = 128
    max_train_bytes: int = 0       # 0: every training document
    max_eval_bytes: int = 0        # cap on the validation and the test split each (0: no cap)
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    eval_windows: int = 0          # validation windows per evaluation (0: all)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"data.source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.source in ("files", "hub") and not self.path:
            raise ValueError(f"data.source = {self.source!r} needs data.path (or --data)")
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len must be >= 2, got {self.seq_len}")
        if not (0 < self.val_fraction < 1 and 0 < self.test_fraction < 1
                and self.val_fraction + self.test_fraction < 1):
            raise ValueError("data.val_fraction and data.test_fraction must be in (0, 1) and sum below 1")


@dataclasses.dataclass
class Corpus:
    """Tokenised splits: flat token arrays, the tokenizer, the held-out test documents' JSONL, a description."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    tokenizer: object             # tokenizers.Tokenizer
    eos_id: int
    description: str
    fingerprint: str
    test_docs: Path               # JSONL {"text": ...} of the test documents (local lm-eval tasks)
    n_docs: dict
    n_bytes: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def windows(self, split: str) -> int:
        arr = getattr(self, split)
        return max(0, (len(arr) - 1) // self.seq_len)

    seq_len: int = 0

    def bytes_per_token(self, split: str) -> float:
        n = len(getattr(self, split))
        return self.n_bytes[split] / n if n else 0.0

    def window(self, split: str, i: int) -> np.ndarray:
        T = self.seq_len
        return getattr(self, split)[i * T:i * T + T + 1]

    def unigram_entropy(self) -> float:
        """Entropy (nats / token) of the training split's token frequencies: the loss of a model that learned
        nothing but how often each token occurs (scored on the training split itself)."""
        counts = np.bincount(self.train, minlength=self.vocab_size).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())


# --- documents ---------------------------------------------------------------------------------------------
def _bucket(key: str) -> float:
    return int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") / 2**64


def _split_of(key: str, cfg: DataConfig) -> str:
    u = _bucket(key)
    return "test" if u < cfg.test_fraction else "val" if u < cfg.test_fraction + cfg.val_fraction else "train"


@functools.lru_cache(maxsize=1)
def stdlib_files() -> tuple[Path, tuple[Path, ...]]:
    """The standard library's ``*.py`` files, sorted; the installed packages under it (site-packages,
    dist-packages) are not walked at all (walking them and dropping their files took seconds a call)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort()
    if not files:
        raise DataError(f"no *.py files under the standard library path {root}; use --data with local text files")
    return root, tuple(files)


def _documents(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """``(identity, text)`` of every document of the source, in a fixed order."""
    if cfg.source == "stdlib":
        root, files = stdlib_files()
        # in hash order, so a byte cap takes files from every package rather than the alphabet's first
        for p in sorted(files, key=lambda p: _bucket("order:" + str(p.relative_to(root)))):
            try:
                yield str(p.relative_to(root)), p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # a handful of test fixtures are not UTF-8: not part of the corpus
        return
    ds = _load_dataset(cfg)
    for i, rec in enumerate(ds):
        text = rec.get(cfg.text_field)
        if not isinstance(text, str):
            where = cfg.path if cfg.source == "hub" else "the files"
            raise DataError(f"{where}: record {i} has no string field {cfg.text_field!r} (fields: "
                            f"{sorted(rec)}); set data.text_field")
        if text:
            yield text, text


def _load_dataset(cfg: DataConfig):
    import datasets

    if cfg.source == "hub":
        try:
            return datasets.load_dataset(cfg.path, cfg.name or None, split=cfg.split, streaming=True)
        except Exception as e:  # noqa: BLE001 - one line: the hub or the name is the problem
            raise DataError(f"hub dataset {cfg.path!r}{f' ({cfg.name})' if cfg.name else ''} could not be opened "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); offline, use local "
                            f"files (--data 'corpus/*.jsonl') or the default stdlib corpus") from None
    paths: list[str] = []
    for pattern in cfg.path.split(","):
        found = sorted(glob.glob(os.path.expanduser(pattern.strip()), recursive=True))
        if not found:
            raise DataError(f"{pattern.strip()}: no such file (data.path / --data takes paths or globs of .txt, "
                            f".jsonl / .json or .parquet files)")
        paths += found
    kinds = {_kind(p) for p in paths}
    if len(kinds) != 1:
        raise DataError(f"{cfg.path}: mixes file kinds {sorted(kinds)}; give one kind (.txt, .jsonl, .parquet)")
    kind = kinds.pop()
    try:
        if kind == "text":  # one document per file, as the stdlib corpus
            return datasets.load_dataset("text", data_files=paths, split="train", sample_by="document")
        return datasets.load_dataset(kind, data_files=paths, split="train")
    except Exception as e:  # noqa: BLE001 - a damaged file: one line naming the files
        msg = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"{cfg.path}: could not be read as {kind} ({type(e).__name__}: {msg})") from None


def _kind(path: str) -> str:
    ext = path.lower().rsplit(".", 1)[-1] if "." in Path(path).name else ""
    kinds = {"txt": "text", "text": "text", "md": "text", "py": "text", "jsonl": "json", "json": "json",
             "parquet": "parquet"}
    if ext not in kinds:
        raise DataError(f"{path}: unknown file kind {ext!r} (use .txt, .jsonl / .json or .parquet)")
    return kinds[ext]


def split_documents(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """``(split, text)`` for every document kept: train capped at ``max_train_bytes``, val / test each at
    ``max_eval_bytes`` (a document that would pass its split's cap is left out; a stream stops once all are full)."""
    sizes = {"train": 0, "val": 0, "test": 0}
    caps = {"train": cfg.max_train_bytes, "val": cfg.max_eval_bytes, "test": cfg.max_eval_bytes}
    for key, text in _documents(cfg):
        split = _split_of(key, cfg)
        n = len(text.encode("utf-8", "surrogatepass"))
        if caps[split] and sizes[split] + n > caps[split]:
            if cfg.source == "hub" and all(caps[s] and sizes[s] >= 0.99 * caps[s] for s in sizes):
                return
            continue
        sizes[split] += n
        yield split, text


def describe(cfg: DataConfig, sizes: dict[str, int], counts: dict[str, int]) -> str:
    mb = sum(sizes.values()) / 1e6
    split = ", ".join(f"{s} {counts[s]} docs / {sizes[s] / 1e6:.2f} MB" for s in ("train", "val", "test"))
    if cfg.source == "stdlib":
        v = sys.version_info
        what = f"Python {v.major}.{v.minor}.{v.micro} standard library source (*.py)"
    elif cfg.source == "hub":
        what = f"hub dataset {cfg.path}" + (f" ({cfg.name})" if cfg.name else "") + f", split {cfg.split}"
    else:
        what = f"local files {cfg.path}"
    return f"{what}: {mb:.2f} MB ({split}), split by document hash"


# --- tokenizers --------------------------------------------------------------------------------------------
def train_tokenizer(docs: list[str], kind: str, vocab_size: int):
    """A byte-level BPE (``kind="bpe"``) or a byte tokenizer (``"bytes"``) with the end-of-text token, trained
    on ``docs`` with the ``tokenizers`` library (deterministic for the same documents)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    size = len(alphabet) + 1 if kind == "bytes" else vocab_size
    if size <= len(alphabet):
        raise DataError(f"data.vocab_size must exceed the {len(alphabet)} byte symbols, got {vocab_size}")
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=[EOT], initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok, tok.token_to_id(EOT)


def hub_tokenizer(name: str):
    """The fast tokenizer of a hub name or local directory (``transformers.AutoTokenizer``)."""
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"tokenizer {name!r} could not be loaded ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); offline, use tokenizer = \"bpe\" or a local "
                        f"directory") from None
    tok = getattr(auto, "backend_tokenizer", None)
    if tok is None or auto.eos_token_id is None:
        raise DataError(f"tokenizer {name!r} has no fast (tokenizers) form or no end-of-text token")
    return tok, int(auto.eos_token_id)


class _SplitWriter:
    """Token ids of one split appended to ``<split>.bin`` in batches of documents, each followed by EOT."""

    def __init__(self, path: Path, tok, eos_id: int, dtype):
        self.f, self.tok, self.eos, self.dtype = open(path, "wb"), tok, eos_id, dtype
        self.pending: list[str] = []
        self.docs = self.bytes = self.tokens = 0

    def add(self, text: str) -> None:
        self.pending.append(text)
        self.docs += 1
        self.bytes += len(text.encode("utf-8", "surrogatepass"))
        if len(self.pending) >= 256:
            self.flush()

    def flush(self) -> None:
        for enc in self.tok.encode_batch(self.pending, add_special_tokens=False):
            ids = np.asarray(enc.ids + [self.eos], dtype=self.dtype)
            ids.tofile(self.f)
            self.tokens += len(ids)
        self.pending = []

    def close(self) -> None:
        self.flush()
        self.f.close()


def corpus_fingerprint(cfg: DataConfig) -> str:
    """What the tokenised splits depend on: the config, and for files the names, sizes and times of the files."""
    ident: dict = {"cfg": dataclasses.asdict(cfg), "v": 1}
    if cfg.source == "stdlib":
        root, files = stdlib_files()
        ident["stdlib"] = [sys.version, len(files), sum(p.stat().st_size for p in files)]
    elif cfg.source == "files":
        paths = sorted(p for pat in cfg.path.split(",") for p in glob.glob(os.path.expanduser(pat.strip()),
                                                                             recursive=True))
        ident["files"] = [(p, os.path.getsize(p), int(os.path.getmtime(p))) for p in paths]
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _build(cfg: DataConfig, folder: Path) -> None:
    """Tokenise the corpus into ``folder`` (written under a temporary name, renamed when complete)."""
    if cfg.tokenizer in ("bpe", "bytes"):  # trained on the training documents: a first pass (local corpora)
        train_docs = [text for split, text in split_documents(cfg) if split == "train"]
        if not train_docs:
            raise DataError(f"the training split of the corpus is empty (source {cfg.source!r}, path {cfg.path!r})")
        tok, eos_id = train_tokenizer(train_docs, cfg.tokenizer, cfg.vocab_size)
        del train_docs
    else:
        tok, eos_id = hub_tokenizer(cfg.tokenizer)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32
    writers = {s: _SplitWriter(tmp / f"{s}.bin", tok, eos_id, dtype) for s in ("train", "val", "test")}
    with open(tmp / "test.jsonl", "w", encoding="utf-8") as held_out:
        for split, text in split_documents(cfg):
            writers[split].add(text)
            if split == "test":
                held_out.write(json.dumps({"text": text}) + "\n")
    for w in writers.values():
        w.close()
    empty = [s for s, w in writers.items() if not w.docs]
    if empty:
        raise DataError(f"the {', '.join(empty)} split(s) of the corpus are empty (source {cfg.source!r}, path "
                        f"{cfg.path!r}): give more documents or raise the byte caps")
    sizes = {s: w.bytes for s, w in writers.items()}
    counts = {s: w.docs for s, w in writers.items()}
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "meta.json").write_text(json.dumps({"eos_id": eos_id, "description": describe(cfg, sizes, counts),
                                               "n_docs": counts, "bytes": sizes, "dtype": np.dtype(dtype).name,
                                               "tokens": {s: w.tokens for s, w in writers.items()}}))
    if folder.exists():  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(folder)


def load_corpus(cfg: DataConfig, cache_root: Path, console=None) -> Corpus:
    """The tokenised corpus of ``cfg``, built once under ``cache_root/<fingerprint>/`` and reused."""
    from tokenizers import Tokenizer

    fp = corpus_fingerprint(cfg)
    folder = Path(cache_root) / fp
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        if console is not None:
            console.print(f"[dim]tokenising the corpus into {folder} (once)[/]")
        _build(cfg, folder)
    try:
        meta = json.loads(meta_file.read_text())
        arrays = {s: np.memmap(folder / f"{s}.bin", dtype=meta["dtype"], mode="r") for s in ("train", "val", "test")}
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise DataError(f"{folder}: damaged corpus cache ({type(e).__name__}: {e}); delete the folder to rebuild "
                        f"it") from None
    if any(len(arrays[s]) != meta["tokens"][s] for s in arrays):
        raise DataError(f"{folder}: truncated corpus cache (token counts differ from meta.json); delete the folder "
                        f"to rebuild it")
    return Corpus(train=arrays["train"], val=arrays["val"], test=arrays["test"], tokenizer=tok,
                  eos_id=int(meta["eos_id"]), description=meta["description"], fingerprint=fp,
                  test_docs=folder / "test.jsonl", n_docs=meta["n_docs"], n_bytes=meta["bytes"], seq_len=cfg.seq_len)


