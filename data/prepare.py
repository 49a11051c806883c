"""Prepare a dataset: corpus text -> DIR/NAME/{train.bin, val.bin, meta.json}.

    python data/prepare.py                                   # tiny Shakespeare, char-level
    python data/prepare.py --tokenizer bpe --vocab_size 4096 # byte-level BPE trained on train
    python data/prepare.py --input my.txt --dataset mine     # any local UTF-8 text file

The first (1 - val_fraction) of the characters are train, the rest val, as in nanoGPT.
Token ids are stored raw, uint16 when the vocabulary fits, else uint32 (meta.json says which).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

# Run as a script, sys.path[0] is data/; import through the repo root so there is one
# data.tokenizer module whether prepare is run or imported.
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from files import atomic_write, write_failure  # noqa: E402
from data.tokenizer import (  # noqa: E402
    DATA_DIR,
    GPT2_PATTERN,
    TOKENIZERS,
    Tokenizer,
    dtype_for_vocab,
    encode_with_merges,
    gpt2_encoding,
    ranks_to_text,
    tokenizer_from_meta,
    train_bpe,
)

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
DEFAULT_BPE_VOCAB = 2048
MAX_BPE_VOCAB = 200_000  # above the largest common BPE vocabularies (o200k); beyond it training only slows
BPE_FILE = "bpe.tiktoken"
BPE_CHECK_CHARS = 20_000  # val text re-encoded by the slow reference encoder to check tiktoken agrees


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", help="output folder name under --data_dir (default: shakespeare_<tokenizer>)")
    p.add_argument("--data_dir", default=str(DATA_DIR), help="root folder of the datasets (default: data/)")
    p.add_argument("--input", help="local UTF-8 corpus file (default: download tiny Shakespeare)")
    p.add_argument("--tokenizer", default="char", choices=TOKENIZERS,
                   help="char, gpt2 (tiktoken's; needs its files) or bpe (trained here on the train split)")
    p.add_argument("--vocab_size", type=int,
                   help=f"bpe vocabulary size, 257..{MAX_BPE_VOCAB} (default {DEFAULT_BPE_VOCAB})")
    p.add_argument("--val_fraction", type=float, default=0.1,
                   help="fraction of the characters, taken from the end, held out for validation")
    args = p.parse_args(argv)
    args.dataset = args.dataset or f"shakespeare_{args.tokenizer}"
    return args


def check_args(args: argparse.Namespace) -> None:
    if args.tokenizer == "bpe":
        args.vocab_size = DEFAULT_BPE_VOCAB if args.vocab_size is None else args.vocab_size
        if not 256 < args.vocab_size <= MAX_BPE_VOCAB:
            raise ValueError(f"--vocab_size {args.vocab_size} is out of range: a byte-level bpe needs "
                             f"257..{MAX_BPE_VOCAB} (the 256 byte tokens plus at least one merge)")
    elif args.vocab_size is not None:
        raise ValueError(f"--vocab_size applies only to --tokenizer bpe; "
                         f"the {args.tokenizer} vocabulary is fixed")
    if not 0 < args.val_fraction < 1:
        raise ValueError(f"--val_fraction {args.val_fraction} is out of range: "
                         f"it must lie strictly between 0 and 1")
    if Path(args.dataset).name != args.dataset or args.dataset in (".", ".."):
        raise ValueError(f"--dataset {args.dataset!r} must be a plain folder name, "
                         f"not a path (the root is --data_dir)")


def read_corpus(path: Path) -> str:
    if not path.exists():
        raise ValueError(f"input file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"input {path} is not a file")
    raw = path.read_bytes()
    if not raw:
        raise ValueError(f"input file {path} is empty; give a UTF-8 text file with some text in it")
    try:
        text = raw.decode("utf-8")  # bytes, not text mode: keep \r\n as is so byte counts are exact
    except UnicodeDecodeError as e:
        raise ValueError(f"input file {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         f"give a UTF-8 text file") from None
    if "\x00" in text:
        raise ValueError(f"input file {path} looks binary (it contains NUL bytes); give a UTF-8 text file")
    return text


def download(url: str, dest: Path) -> None:
    """Download url to dest with a progress bar, through a .part file so a broken download is not cached."""
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as resp, open(part, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {dest.name}") as bar:
                while chunk := resp.read(1 << 16):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:  # urllib.error.URLError, timeouts and socket errors are all OSErrors
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise ValueError(f"could not download the corpus from {url} ({reason}); "
                         f"pass --input PATH to use a local copy of the text") from None
    part.replace(dest)


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    n = int(len(text) * (1 - val_fraction))
    train, val = text[:n], text[n:]
    if not train or not val:
        raise ValueError(f"the corpus ({len(text)} characters) is too small to split with "
                         f"--val_fraction {val_fraction}: a split would be empty")
    return train, val


def build_tokenizer(args: argparse.Namespace, text: str, train: str, val: str) -> tuple[Tokenizer, dict]:
    """The tokenizer and its meta fields (for bpe, 'bpe_ranks' holds the ranks file's text). The tokenizer
    is rebuilt from those fields, exactly as train.py and sample.py will rebuild it."""
    if args.tokenizer == "char":
        # the vocabulary comes from the whole corpus, as nanoGPT's, so val has no unknown characters
        chars = sorted(set(text))
        fields = {"chars": chars, "start_id": chars.index("\n") if "\n" in chars else 0}
    elif args.tokenizer == "gpt2":
        eot = gpt2_encoding().eot_token
        fields = {"eot": eot, "start_id": eot}
    else:
        t0 = time.time()
        ranks, merges = train_bpe(train, args.vocab_size)
        print(f"trained bpe: {len(ranks)} tokens, {len(merges)} merges in {time.time() - t0:.1f}s")
        if len(ranks) < args.vocab_size:
            print(f"warning: the train split ran out of pairs to merge at {len(ranks)} tokens, "
                  f"fewer than --vocab_size {args.vocab_size}")
        fields = {"bpe_file": BPE_FILE, "bpe_pattern": GPT2_PATTERN, "start_id": ranks[b"\n"],
                  "bpe_ranks": ranks_to_text(ranks)}
    tok = tokenizer_from_meta({"tokenizer": args.tokenizer, **fields})
    if args.tokenizer == "bpe":
        sample = val[:BPE_CHECK_CHARS]
        assert tok.encode(sample) == encode_with_merges(sample, merges), "tiktoken disagrees with the learned merges"
    return tok, fields


def write_ids(ids: list[int], dtype: str, path: Path) -> int:
    arr = np.array(ids, dtype=np.dtype(dtype))
    assert len(ids) == 0 or int(arr.max()) == max(ids), f"token ids overflow {dtype}"
    atomic_write(path, lambda f: f.write(memoryview(arr).cast("B")))  # the ids' bytes, without a copy
    return len(arr)


def prepare(args: argparse.Namespace) -> dict:
    t0 = time.time()
    out_dir = Path(args.data_dir) / args.dataset
    if args.input:
        corpus_path = Path(args.input)
    else:
        corpus_path = out_dir / "input.txt"
        if not corpus_path.is_file():
            out_dir.mkdir(parents=True, exist_ok=True)
            download(SHAKESPEARE_URL, corpus_path)
    text = read_corpus(corpus_path)
    train, val = split_text(text, args.val_fraction)
    tok, tok_meta = build_tokenizer(args, text, train, val)
    dtype = dtype_for_vocab(tok.vocab_size)

    try:
        out_dir.mkdir(parents=True, exist_ok=True)  # only now, so bad input leaves no folder behind
        # meta.json goes first and comes back last: a prepare stopped in between (a full disk, Ctrl-C) leaves
        # a folder that train.py refuses as unprepared, never a mix of old and new files
        (out_dir / "meta.json").unlink(missing_ok=True)
    except OSError as e:
        raise write_failure(out_dir, e) from None
    meta = {"dataset": args.dataset, "tokenizer": args.tokenizer, "vocab_size": tok.vocab_size, "dtype": dtype}
    for split, split_text_ in (("train", train), ("val", val)):
        meta[f"{split}_tokens"] = write_ids(tok.encode(split_text_), dtype, out_dir / f"{split}.bin")
        meta[f"{split}_bytes"] = len(split_text_.encode("utf-8"))
    if "bpe_ranks" in tok_meta:  # a file of its own; load_meta inlines it again
        ranks = tok_meta.pop("bpe_ranks").encode("ascii")
        atomic_write(out_dir / BPE_FILE, lambda f: f.write(ranks))
    meta |= tok_meta
    meta |= {"val_fraction": args.val_fraction,
             "source": str(corpus_path.resolve()) if args.input else SHAKESPEARE_URL}
    text = json.dumps(meta, indent=1, ensure_ascii=False) + "\n"
    atomic_write(out_dir / "meta.json", lambda f: f.write(text.encode("utf-8")))

    print(f"{out_dir}: {args.tokenizer} tokenizer, vocab {tok.vocab_size}, ids {dtype}")
    for split in ("train", "val"):
        tokens, nbytes = meta[f"{split}_tokens"], meta[f"{split}_bytes"]
        print(f"  {split:5s} {tokens:>10,} tokens  {nbytes:>10,} bytes  {tokens / nbytes:.3f} tokens/byte")
    print(f"  done in {time.time() - t0:.1f}s")
    return meta


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        prepare(args)
    except ValueError as e:  # bad input or an unreachable resource: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
