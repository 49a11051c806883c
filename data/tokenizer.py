"""Tokenizers and the prepared-dataset format shared by prepare.py, train.py and sample.py.

A prepared dataset is a folder holding train.bin and val.bin (token ids, raw
little-endian uint16 or uint32) and meta.json, which says how to rebuild the
tokenizer. Four tokenizers:

- char: one id per character of the corpus, vocabulary sorted (nanoGPT's shakespeare_char).
- gpt2: tiktoken's GPT-2 encoding (its files come from the network or tiktoken's cache).
- bpe:  a byte-level BPE trained on the train split (data/bpe.py), saved as a tiktoken ranks
        file and run through tiktoken.Encoding, so encoding runs at tiktoken's speed. A
        dataset of several documents adds GPT-2's end-of-text token after the ranks.
- hf:NAME_OR_PATH: the tokenizer of a transformers checkpoint (what a model imported with
        init_from=hf:NAME was trained with, found by data/hub.py), saved as its tokenizer.json
        and run by the tokenizers library that transformers installs.

load_meta() returns a self-contained dict (the bpe ranks and the tokenizer.json inlined, only
JSON types) that checkpoints embed, so a checkpoint can be sampled without its dataset folder.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Protocol

import numpy as np
import tiktoken

from config import optional_package

DATA_DIR = Path(__file__).resolve().parent  # default root of the prepared datasets
TOKENIZERS = ("char", "gpt2", "bpe", "hf:NAME_OR_PATH")
HF_PREFIX = "hf:"
HF_FILE = "tokenizer.json"  # an hf dataset's tokenizer, beside meta.json
SPLITS = ("train", "val")

# GPT-2's pre-tokenisation: contractions, letter runs, digit runs, punctuation runs, each
# with one optional leading space, then whitespace. tiktoken's gpt2 pat_str is the same
# pattern written with possessive quantifiers (tests check both split text identically).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"


class Tokenizer(Protocol):
    """What train.py and sample.py need from a tokenizer."""

    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One id per character; the vocabulary is the sorted set of the corpus's characters."""

    name = "char"

    def __init__(self, chars: list[str]):
        assert all(len(c) == 1 for c in chars), "char vocabulary entries must be single characters"
        assert len(set(chars)) == len(chars), "char vocabulary has duplicates"
        self.chars = list(chars)
        self.vocab_size = len(self.chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = list(dict.fromkeys(c for c in text if c not in self.stoi))
            shown = ", ".join(repr(c) for c in unknown[:10])
            more = f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""
            raise ValueError(
                f"text contains {len(unknown)} character(s) outside the vocabulary: {shown}{more}; "
                f"this model's vocabulary is char-level, the {self.vocab_size} characters of its "
                f"training dataset"
            ) from None

    def decode(self, ids: list[int]) -> str:
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise ValueError(f"token id {int(i)} is outside the char vocabulary [0, {self.vocab_size})")
        return "".join(self.chars[int(i)] for i in ids)


class TiktokenTokenizer:
    """Wraps a tiktoken.Encoding; text is always encoded as ordinary text, so a literal
    '<|endoftext|>' in a prompt is just characters, never the special token."""

    def __init__(self, encoding: tiktoken.Encoding, name: str):
        self.encoding = encoding
        self.name = name
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        # a byte-level token sequence may cut a UTF-8 character; show U+FFFD rather than fail
        return self.encoding.decode([int(i) for i in ids], errors="replace")


class HFTokenizer:
    """A transformers checkpoint's tokenizer (its tokenizer.json, run by the tokenizers library); text is encoded
    without added special tokens, as the other tokenizers encode ordinary text."""

    def __init__(self, tokenizer_json: str, name: str):
        # installed with transformers, which importing a model needs anyway
        tokenizers = optional_package("tokenizers", f"the {name} tokenizer", "pip install -e '.[hf]'")
        self.backend = tokenizers.Tokenizer.from_str(tokenizer_json)
        self.name = f"hf:{name}"
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)


# ----------------------------------------------------------------------------- gpt2


def gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding; ValueError with the remedy when its files are unreachable."""
    try:
        return tiktoken.get_encoding("gpt2")
    except OSError as e:  # requests' errors (no network, HTTP errors) subclass OSError, as do cache IO errors
        cache = os.environ.get("TIKTOKEN_CACHE_DIR")
        unset_or_empty = {None: "unset, so tiktoken's default in the temp dir", "": "empty, so no cache"}
        cache = unset_or_empty.get(cache, cache)
        raise ValueError(
            f"the gpt2 tokenizer needs tiktoken's GPT-2 encoding files, downloaded once into "
            f"TIKTOKEN_CACHE_DIR ({cache}); they are not there and the download failed "
            f"({type(e).__name__}). Go online once, point TIKTOKEN_CACHE_DIR at a cache that "
            f"holds them, or use --tokenizer bpe to train a tokenizer locally"
        ) from None


# ----------------------------------------------------------------------------- bpe: the ranks format


def ranks_to_text(ranks: dict[bytes, int]) -> str:
    """The tiktoken ranks format (what tiktoken.load.load_tiktoken_bpe reads): `base64 rank` lines."""
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    return "".join(f"{base64.b64encode(tok).decode('ascii')} {rank}\n" for tok, rank in by_rank)


def ranks_from_text(text: str) -> dict[bytes, int]:
    # parsed here rather than by load_tiktoken_bpe, which caches files by path and could serve a stale copy
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bpe_encoding(
    ranks: dict[bytes, int], pattern: str = GPT2_PATTERN, name: str = "bpe", eot: int | None = None
) -> tiktoken.Encoding:
    """The tiktoken Encoding of trained ranks; eot, when given, is the id of an end-of-text token
    (GPT-2's '<|endoftext|>') appended after the ranks, which separates documents."""
    assert sorted(ranks.values()) == list(range(len(ranks))), "bpe ranks must be the ids 0..n-1"
    assert all(bytes([i]) in ranks for i in range(256)), "a byte-level bpe needs all 256 byte tokens"
    assert eot in (None, len(ranks)), f"the end-of-text id must follow the ranks: {len(ranks)}, not {eot}"
    special = {} if eot is None else {GPT2_EOT: eot}
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


# ----------------------------------------------------------------------------- datasets


def dtype_for_vocab(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id 0..vocab_size-1."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def prepare_command(dataset_dir: str | os.PathLike) -> str:
    """The prepare.py command that (re)creates dataset_dir, for error messages."""
    path = Path(dataset_dir).resolve()
    cmd = "python -m data.prepare"
    tokenizer = path.name.rsplit("_", 1)[-1]
    if path.name in {f"shakespeare_{t}" for t in TOKENIZERS}:
        cmd += f" --tokenizer {tokenizer}"  # the default dataset name for that tokenizer
    else:
        cmd += f" --dataset {path.name} --input PATH"
        if tokenizer in TOKENIZERS:
            cmd += f" --tokenizer {tokenizer}"
    if path.parent != DATA_DIR:
        cmd += f" --data_dir {path.parent}"
    return cmd


META_KEYS = ("dataset", "tokenizer", "vocab_size", "dtype", "train_tokens", "val_tokens", "train_bytes", "val_bytes")
ID_DTYPES = ("uint16", "uint32")
CHECKED_IDS = 1 << 20  # ids at each end of a split checked against the vocabulary when it is first opened


def damaged(dataset_dir: str | os.PathLike) -> str:
    """The end of every message about a damaged dataset: how to make it again."""
    return f"the dataset is damaged; re-create it with `{prepare_command(dataset_dir)}`"


def load_meta(dataset_dir: str | os.PathLike) -> dict:
    """meta.json of a prepared dataset, checked and made self-contained: for bpe the ranks file's text is
    inlined as meta['bpe_ranks']. Holds only JSON types, so torch.load(weights_only=True) accepts it."""
    path = Path(dataset_dir) / "meta.json"
    if not path.is_file():
        raise ValueError(
            f"no prepared dataset at {dataset_dir} ({path.name} is missing); "
            f"create it with `{prepare_command(dataset_dir)}`"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
        raise ValueError(f"{path} is not valid JSON ({e}); {damaged(dataset_dir)}") from None
    missing = [k for k in META_KEYS if k not in meta] if isinstance(meta, dict) else list(META_KEYS)
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; {damaged(dataset_dir)}")
    if meta["dtype"] not in ID_DTYPES:
        raise ValueError(
            f"{path} gives dtype={meta['dtype']!r}, not one of {', '.join(ID_DTYPES)}; {damaged(dataset_dir)}"
        )
    inlined = {"bpe": ("bpe_file", "bpe_ranks"), "hf": ("hf_file", "hf_tokenizer")}.get(meta.get("tokenizer"))
    if inlined:
        path = Path(dataset_dir) / meta[inlined[0]]
        if not path.is_file():
            raise ValueError(
                f"the tokenizer file {path} is missing; recreate the dataset with `{prepare_command(dataset_dir)}`"
            )
        meta[inlined[1]] = path.read_text(encoding="utf-8")
    return meta


def tokenizer_from_meta(meta: dict) -> Tokenizer:
    kind = meta.get("tokenizer")
    if kind == "char":
        return CharTokenizer(meta["chars"])
    if kind == "gpt2":
        return TiktokenTokenizer(gpt2_encoding(), "gpt2")
    if kind == "bpe":
        if "bpe_ranks" not in meta:
            raise ValueError(
                "bpe meta has no 'bpe_ranks'; read it with load_meta(dataset_dir), which inlines the ranks file"
            )
        ranks = ranks_from_text(meta["bpe_ranks"])
        # "eot": datasets of several documents (older datasets and single texts have none)
        encoding = bpe_encoding(
            ranks, meta.get("bpe_pattern", GPT2_PATTERN), name=f"bpe{len(ranks)}", eot=meta.get("eot")
        )
        return TiktokenTokenizer(encoding, "bpe")
    if kind == "hf":
        return HFTokenizer(meta["hf_tokenizer"], meta["hf_name"])
    raise ValueError(f"unknown tokenizer {kind!r} in meta; valid: {', '.join(TOKENIZERS)}")


def open_split(dataset_dir: str | os.PathLike, split: str, meta: dict) -> np.memmap:
    """Token ids of a split, memory-mapped read-only with the dtype recorded in meta, once its size agrees
    with meta's."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    path = Path(dataset_dir) / f"{split}.bin"
    if not path.is_file():
        raise ValueError(f"{path} is missing; create it with `{prepare_command(dataset_dir)}`")
    dtype, size = np.dtype(meta["dtype"]), path.stat().st_size
    if size % dtype.itemsize:
        raise ValueError(
            f"{path} is {size:,} bytes, not a multiple of {dtype.itemsize} (the size of its "
            f"{meta['dtype']} ids): it is truncated; {damaged(dataset_dir)}"
        )
    if size // dtype.itemsize != meta[f"{split}_tokens"]:
        raise ValueError(
            f"{path} holds {size // dtype.itemsize:,} tokens where meta.json says "
            f"{meta[f'{split}_tokens']:,}; {damaged(dataset_dir)}"
        )
    return np.memmap(path, dtype=dtype, mode="r")


def check_ids(dataset_dir: str | os.PathLike, split: str, meta: dict) -> None:
    """The ids at both ends of a split lie inside meta's vocabulary (files of two datasets mixed, or noise,
    would not)."""
    data = open_split(dataset_dir, split, meta)
    top = int(max(data[:CHECKED_IDS].max(), data[-CHECKED_IDS:].max()))
    if top >= meta["vocab_size"]:
        raise ValueError(
            f"{Path(dataset_dir) / f'{split}.bin'} holds token id {top}, outside the vocabulary of "
            f"{meta['vocab_size']} that meta.json gives; {damaged(dataset_dir)}"
        )


def bytes_per_token(meta: dict, split: str = "val") -> float:
    """UTF-8 bytes of text per token; bits per byte = loss / ln 2 / bytes_per_token."""
    return meta[f"{split}_bytes"] / meta[f"{split}_tokens"]
