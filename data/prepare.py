"""Prepare a dataset: corpus text -> DIR/NAME/{train.bin, val.bin, meta.json}.

    python -m data.prepare                                   # tiny Shakespeare, char-level
    python -m data.prepare --tokenizer bpe --vocab_size 4096 # byte-level BPE trained on train
    python -m data.prepare --input my.txt --dataset mine     # any local UTF-8 text file
    python -m data.prepare --input corpus/ --dataset web --tokenizer gpt2     # a folder: its *.txt and *.jsonl
    python -m data.prepare --input 'dumps/*.jsonl' --dataset web --tokenizer gpt2  # a glob, quoted

The corpus is one file, a folder (its *.txt and *.jsonl files, recursively) or a glob, its files read in sorted
order. A text file is one document; a .jsonl file holds one document a line, the "text" field of a JSON object.
Documents are separated by the end-of-text token (gpt2; bpe adds one to its vocabulary) or a newline (char).
Validation: a single document keeps its last val_fraction of characters, as nanoGPT; several documents give
val_fraction of the documents, evenly spread through them.

The corpus is streamed: read in chunks, cut only where encoding the pieces apart gives the ids of the whole,
encoded by --num_proc processes, and written as it goes, so memory stays bounded whatever the corpus's size.
The dataset is written into a temporary folder beside its own and moved in once complete. Token ids are stored
raw, uint16 when the vocabulary fits, else uint32 (meta.json says which).
"""

from __future__ import annotations

if not __package__:  # typed as a path, the import path holds data/ and not the project: the imports below would fail
    raise SystemExit("run it as a module, from the project's folder: python -m data.prepare [--key=value ...]")

import codecs
import collections
import glob
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import regex
from tqdm import tqdm

import config
from config import POSITIVE, opt, validate
from data.bpe import encode_with_merges, pretokenize, train_bpe_from_counts
from data.hub import hf_tokenizer_fields
from data.staging import Stream, staged_folder
from data.tokenizer import (
    DATA_DIR,
    GPT2_PATTERN,
    HF_FILE,
    HF_PREFIX,
    SPLITS,
    TOKENIZERS,
    TiktokenTokenizer,
    dtype_for_vocab,
    gpt2_encoding,
    ranks_to_text,
    tokenizer_from_meta,
)
from files import atomic_write

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DEFAULT_BPE_VOCAB = 2048
MAX_BPE_VOCAB = 200_000  # above the largest common BPE vocabularies (o200k); beyond it training only slows
BPE_FILE = "bpe.tiktoken"
BPE_CHECK_CHARS = 20_000  # val text re-encoded by the slow reference encoder to check tiktoken agrees
# bpe trains on at most this much train text, taken across the split: its memory (the counts of the distinct
# pre-tokens) and its training time grow with it
BPE_TRAIN_CHARS = 1 << 25
READ_BYTES = 1 << 20  # a text file is read this much at a time
# text a worker encodes in one go: enough that handing it over is cheap beside encoding it, little enough that many
# are in flight at once in bounded memory
CHUNK_CHARS = 1 << 18
MAX_CHUNK_CHARS = 1 << 24  # past this, a document with no safe place to cut (see safe_cut) is cut anyway
# by default, a process only for each this much text: starting one (an interpreter, the tokenizer) costs more than
# it would save on less
PARALLEL_CHARS = 1 << 23


def default_num_proc() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class PrepareConfig:
    dataset: str = opt("", "output folder name under data_dir (default: shakespeare_<tokenizer>)")
    data_dir: str = opt(str(DATA_DIR), "root folder of the datasets")
    input: str = opt(
        "",
        "local UTF-8 corpus: a file, a folder (its *.txt and *.jsonl files, recursively) or a quoted "
        'glob; .jsonl: one JSON object a line, the document in its "text" (default: download tiny '
        "Shakespeare)",
    )
    tokenizer: str = opt(
        "char",
        "char, gpt2 (tiktoken's; needs its files), bpe (trained here on the train split, at "
        f"most {BPE_TRAIN_CHARS:,} characters of it, evenly spread) or hf:NAME_OR_PATH (a "
        "transformers checkpoint's, for a model imported with train.py "
        "--init_from=hf:NAME_OR_PATH)",
    )
    vocab_size: int | None = opt(
        None,
        f"bpe vocabulary size, 257..{MAX_BPE_VOCAB} (default {DEFAULT_BPE_VOCAB}); "
        "with several documents it includes the end-of-text token",
    )
    val_fraction: float = opt(
        0.1,
        "held out for validation: of a single document, this fraction of its characters, "
        "from the end; of several, this fraction of the documents, evenly spread",
        check=("lie strictly between 0 and 1", lambda v: 0 < v < 1),
    )
    num_proc: int | None = opt(
        None,
        "processes that encode (default: the cores this process may use, fewer for a small corpus)",
        check=POSITIVE,
    )

    def __post_init__(self):
        validate(self)
        if self.tokenizer not in TOKENIZERS[:-1] and not self.tokenizer.startswith(HF_PREFIX):
            raise ValueError(f"tokenizer={self.tokenizer!r} is unknown; choose one of {', '.join(TOKENIZERS)}")
        if self.tokenizer != "bpe" and self.vocab_size is not None:
            raise ValueError(f"vocab_size applies only to tokenizer=bpe; the {self.tokenizer} vocabulary is fixed")
        if self.tokenizer == "bpe":  # the defaults' own rules, resolved once
            self.vocab_size = DEFAULT_BPE_VOCAB if self.vocab_size is None else self.vocab_size
            if not 256 < self.vocab_size <= MAX_BPE_VOCAB:
                raise ValueError(
                    f"vocab_size={self.vocab_size} is out of range: a byte-level bpe needs "
                    f"257..{MAX_BPE_VOCAB} (the 256 byte tokens plus at least one merge)"
                )
        self.dataset = self.dataset or f"shakespeare_{self.tokenizer.removeprefix(HF_PREFIX).replace('/', '_')}"
        if Path(self.dataset).name != self.dataset or self.dataset in (".", ".."):
            raise ValueError(f"dataset={self.dataset!r} must be a plain folder name, not a path (the root is data_dir)")


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
        raise ValueError(
            f"could not download the corpus from {url} ({reason}); pass --input PATH to use a local copy of the text"
        ) from None
    part.replace(dest)


# ----------------------------------------------------------------------------- reading the corpus


def find_files(spec: str) -> list[Path]:
    """The files of --input: the file itself, a folder's *.txt and *.jsonl files (recursively) or a glob's
    matches, in sorted order."""
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
        if not files:
            raise ValueError(f"input folder {spec} holds no .txt or .jsonl files (searched recursively)")
        return files
    if path.exists():
        raise ValueError(f"input {spec} is neither a file nor a folder")
    if glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not files:
            raise ValueError(f"input pattern {spec!r} matches no files")
        return files
    raise ValueError(f"input file {spec} does not exist")


class Corpus:
    """The documents of --input's files, read as pieces of text, a bounded amount at a time."""

    def __init__(self, spec: str):
        self.spec, self.files = spec, find_files(spec)
        self.nbytes = sum(f.stat().st_size for f in self.files)

    def source(self) -> str:
        """What meta.json records as the corpus: the file or folder, or the pattern."""
        path = Path(self.spec)
        return str(path.resolve()) if path.exists() else os.path.abspath(self.spec)

    def pieces(self, progress):
        """(starts a document, text) for each piece of each non-empty document; progress(n) is told of each n bytes
        read."""
        for path in self.files:
            read = read_jsonl if path.suffix == ".jsonl" else read_text
            try:
                yield from read(path, progress)
            except OSError as e:
                raise ValueError(f"cannot read input file {path}: {e.strerror or e}") from None


def read_text(path: Path, progress):
    """A text file as one document, in pieces; strict UTF-8 (bytes, not text mode: \\r\\n is kept as is)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, first = 0, True
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_BYTES)
            held = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"input file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                    f"{offset - held + e.start}); give a UTF-8 text file"
                ) from None
            if "\x00" in text:
                raise ValueError(f"input file {path} looks binary (it contains NUL bytes); give a UTF-8 text file")
            if text:
                yield first, text
                first = False
            if not block:
                return
            offset += len(block)
            progress(len(block))


def read_jsonl(path: Path, progress):
    """A .jsonl file: one document a line, the "text" of a JSON object; blank lines are skipped."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            progress(len(line))
            if not line.strip():
                continue
            where = f"input file {path} line {number}"
            try:
                doc = json.loads(line.rstrip(b"\r\n").decode("utf-8"))  # columns counted on this line
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{where} is not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1}); give UTF-8 text"
                ) from None
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{where} is not valid JSON ({e.msg} at column {e.colno}); each line must be a "
                    f'JSON object with the document in "text"'
                ) from None
            if not isinstance(doc, dict) or "text" not in doc:
                raise ValueError(
                    f'{where} has no "text" field; each line must be a JSON object with the document in "text"'
                )
            if not isinstance(doc["text"], str):
                raise ValueError(f'{where} has a "text" that is a {type(doc["text"]).__name__}, not a string')
            if doc["text"]:
                yield True, doc["text"]


def progress_bar(total: int, desc: str) -> tqdm:
    # on a terminal only: in a log it would be noise, and on a pipe it would precede an error line
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=None)


@dataclass
class Scan:
    """What a first pass over the corpus finds: it also checks every file before anything is written."""

    documents: int = 0
    chars: int = 0
    charset: set | None = None  # the char tokenizer's characters


def scan(corpus: Corpus, charset: bool) -> Scan:
    found = Scan(charset=set() if charset else None)
    with progress_bar(corpus.nbytes, "reading") as bar:
        for starts, text in corpus.pieces(bar.update):
            found.documents += starts
            found.chars += len(text)
            if charset:
                found.charset.update(text)
    if not found.documents:
        if len(corpus.files) == 1 and corpus.files[0].suffix != ".jsonl":
            raise ValueError(f"input file {corpus.files[0]} is empty; give a UTF-8 text file with some text in it")
        raise ValueError(f"input {corpus.spec} holds no text ({len(corpus.files)} files, every document empty)")
    return found


# ----------------------------------------------------------------------------- the split


@dataclass
class Split:
    """Which text is train and which val. One document: its first train_chars characters are train, the rest val
    (nanoGPT's split). Several: val_documents of the documents, evenly spread, so any slice of the corpus is
    represented, and the same ones on every run."""

    documents: int
    train_chars: int | None = None
    val_documents: int = 0

    @classmethod
    def plan(cls, found: Scan, val_fraction: float) -> Split:
        if found.documents > 1:
            n = found.documents
            return cls(n, val_documents=min(n - 1, max(1, round(n * val_fraction))))
        train_chars = int(found.chars * (1 - val_fraction))
        if not 0 < train_chars < found.chars:
            raise ValueError(
                f"the corpus ({found.chars} characters) is too small to split with "
                f"--val_fraction {val_fraction}: a split would be empty"
            )
        return cls(1, train_chars=train_chars)

    def of(self, doc: int) -> str:
        # document doc is the first of a new multiple of documents/val_documents: exactly val_documents in all,
        # the last among them
        n, k = self.documents, self.val_documents
        return "val" if (doc + 1) * k // n > doc * k // n else "train"

    def pieces(self, pieces):
        """((split, document index), text) for each (starts a document, text) piece."""
        doc, offset = -1, 0
        for starts, text in pieces:
            doc += starts
            if self.train_chars is None:
                yield (self.of(doc), doc), text
                continue
            n = self.train_chars - offset
            if n > 0:
                yield ("train", doc), text[:n]
            if n < len(text):
                yield ("val", doc), text[max(n, 0) :]
            offset += len(text)


# ----------------------------------------------------------------------------- chunks

# Where a text can be cut so that its two parts, encoded apart, give the ids of the whole, under GPT-2's
# pre-tokenisation (gpt2 and bpe; char may be cut anywhere). BPE merges only within a pre-token, so it is enough that
# the cut falls between two pre-tokens and leaves every pre-token as it was. The pattern has no lookbehind, so the
# part after the cut splits as the whole did from there. The part before ends in a non-space, whose pre-token ends
# with it (a space may only lead a pre-token, as in " word"), and the pattern's one lookahead, (?!\S), works within
# whitespace runs, none of which reaches the cut. Two kinds of cut, the first preferred:
# - the end of a word: a non-space followed by whitespace;
# - a change of class between two non-spaces: letter | other, number | other, or punctuation | letter or number, but
#   never after an apostrophe, which would split "'s", "'ll" and the other contractions.
# A run of MAX_CHUNK_CHARS with neither (one "word" that long) is cut anyway: the one place ids may differ.
WORD_END = regex.compile(r"\S(?=\s)")
LAST_WORD_END = regex.compile(r"(?r)\S(?=\s)")
LAST_CLASS_CHANGE = regex.compile(r"(?r)\p{L}(?=[^\s\p{L}])|\p{N}(?=[^\s\p{N}])|[^\s\p{L}\p{N}'](?=[\p{L}\p{N}])")


def safe_cut(text: str, start: int, end: int) -> int:
    """The last safe place to cut text in (start, end], or 0 where there is none."""
    for pattern in (LAST_WORD_END, LAST_CLASS_CHANGE):
        if m := pattern.search(text, start, end + 1):
            return m.end()
    return 0


def next_cut(text: str, start: int, target: int) -> int:
    """Where the chunk of text that begins at start ends: about target characters on, at a safe cut; 0 to wait for
    more text."""
    if cut := safe_cut(text, start, start + target):
        return cut
    if m := WORD_END.search(text, start + target):
        return m.end()
    return start + target if len(text) - start > MAX_CHUNK_CHARS else 0


def chunks(pieces, target: int = CHUNK_CHARS):
    """The (key, text) pieces regrouped into (key, chunk) of about target characters, each cut at a safe place;
    a new key (another document or split) always starts a new chunk."""
    pending, key = "", None
    for k, text in pieces:
        if k != key:
            if pending:
                yield key, pending
            pending, key = text, k
        else:
            pending += text
        start = 0
        while len(pending) - start > target and (cut := next_cut(pending, start, target)):
            yield key, pending[start:cut]
            start = cut
        pending = pending[start:]
    if pending:
        yield key, pending


@dataclass
class Task:
    """Text of one split for one worker: segments of (a separator goes first, text)."""

    split: str
    segments: list
    read: int  # bytes of the corpus read when the task was made, for the progress bar


def tasks(chunks, read):
    """Chunks batched per split into tasks of at least CHUNK_CHARS characters (many short documents share one), with
    a separator before each document but the first of its split."""
    last_doc = dict.fromkeys(SPLITS)
    batch, size = {s: [] for s in SPLITS}, dict.fromkeys(SPLITS, 0)
    for (split, doc), text in chunks:
        batch[split].append((last_doc[split] not in (None, doc), text))
        last_doc[split] = doc
        size[split] += len(text)
        if size[split] >= CHUNK_CHARS:
            yield Task(split, batch[split], read())
            batch[split], size[split] = [], 0
    for split in SPLITS:
        if batch[split]:
            yield Task(split, batch[split], read())


# ----------------------------------------------------------------------------- encoding


class Encoder:
    """Encodes a task's segments to one array of ids; built alike in the parent and in each worker."""

    def __init__(self, fields: dict, dtype: str):
        self.tok = tokenizer_from_meta(fields)
        self.dtype = np.dtype(dtype)
        if "eot" in fields:
            self.sep = np.array([fields["eot"]], dtype=self.dtype)
        elif "\n" in fields.get("chars", ()):
            self.sep = np.array([fields["chars"].index("\n")], dtype=self.dtype)
        else:
            self.sep = None  # a single document: nothing to separate

    def __call__(self, segments) -> tuple[np.ndarray, int]:
        """The ids and the UTF-8 bytes of the text (separators not counted)."""
        parts, nbytes = [], 0
        for sep, text in segments:
            if sep:
                assert self.sep is not None, "documents to separate, but the tokenizer has no separator"
                parts.append(self.sep)
            parts.append(self.ids(text))
            nbytes += len(text) if text.isascii() else len(text.encode("utf-8"))
        return np.concatenate(parts), nbytes

    def ids(self, text: str) -> np.ndarray:
        if isinstance(self.tok, TiktokenTokenizer):
            # encode_ordinary's ids (no special token allowed, none refused), without a Python list between
            return self.tok.encoding.encode_to_numpy(text, disallowed_special=()).astype(self.dtype)
        return np.array(self.tok.encode(text), dtype=self.dtype)


_encoder = None  # a worker's own


def start_worker(fields: dict, dtype: str) -> None:
    global _encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the pool
    threading.Thread(target=exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _encoder = Encoder(fields, dtype)


def exit_with_parent(parent: int) -> None:
    # a parent killed outright cannot end its pool, and a worker would wait for tasks forever: its siblings hold
    # the task queue's other end open
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def encode_in_worker(segments):
    return _encoder(segments)


def encode(tasks, fields: dict, dtype: str, num_proc: int, write) -> None:
    """write(task, ids, nbytes) for each task, in order, the encoding spread over num_proc processes; at most two
    tasks a process are in flight, so memory stays bounded."""
    if num_proc == 1:
        encoder = Encoder(fields, dtype)
        for task in tasks:
            write(task, *encoder(task.segments))
        return
    # spawn: a fresh interpreter, whatever threads the parent runs (fork copies them in any state)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(num_proc, context, initializer=start_worker, initargs=(fields, dtype)) as pool:
        inflight = collections.deque()
        try:
            for task in tasks:
                inflight.append((task, pool.submit(encode_in_worker, task.segments)))
                task.segments = None  # the worker has it: keep no second copy
                if len(inflight) > 2 * num_proc:
                    done, future = inflight.popleft()
                    write(done, *future.result())
            for done, future in inflight:
                write(done, *future.result())
        except BrokenProcessPool:
            raise ValueError(
                f"an encoding process died (killed for lack of memory?); try fewer with --num_proc (it was {num_proc})"
            ) from None
        except BaseException:  # an error or Ctrl-C here: drop the queued tasks rather than finish them
            pool.shutdown(cancel_futures=True)
            raise


# ----------------------------------------------------------------------------- the tokenizer


def tokenizer_fields(args: PrepareConfig, corpus: Corpus, found: Scan, split: Split) -> dict:
    """The tokenizer's meta fields, its name included (for bpe, 'bpe_ranks' holds the ranks file's text). The
    tokenizer is rebuilt from them, exactly as train.py and sample.py will rebuild it."""
    several = split.documents > 1
    if args.tokenizer == "char":
        # the vocabulary comes from the whole corpus, as nanoGPT's, so val has no unknown characters
        chars = sorted(found.charset | ({"\n"} if several else set()))  # "\n" separates documents
        return {"tokenizer": "char", "chars": chars, "start_id": chars.index("\n") if "\n" in chars else 0}
    if args.tokenizer == "gpt2":
        eot = gpt2_encoding().eot_token
        return {"tokenizer": "gpt2", "eot": eot, "start_id": eot}
    if args.tokenizer.startswith(HF_PREFIX):
        fields = hf_tokenizer_fields(args.tokenizer.removeprefix(HF_PREFIX), f"tokenizer={args.tokenizer}")
        if several and "eot" not in fields:
            raise ValueError(
                f"--tokenizer {args.tokenizer} has no end-of-text token to separate documents; "
                "give a single text, or another tokenizer"
            )
        return fields
    if several and args.vocab_size < 258:
        raise ValueError(
            f"--vocab_size {args.vocab_size} is out of range for a corpus of several documents: it "
            f"needs 258..{MAX_BPE_VOCAB} (the 256 byte tokens, a merge and the end-of-text token)"
        )
    counts, check = bpe_sample(corpus, found, split)
    t0 = time.time()
    ranks, merges = train_bpe_from_counts(counts, args.vocab_size - several)
    print(f"trained bpe: {len(ranks)} tokens, {len(merges)} merges in {time.time() - t0:.1f}s")
    if len(ranks) < args.vocab_size - several:
        print(
            f"warning: the train split ran out of pairs to merge at {len(ranks)} tokens, "
            f"fewer than --vocab_size {args.vocab_size}"
        )
    fields = {"tokenizer": "bpe", "bpe_file": BPE_FILE, "bpe_pattern": GPT2_PATTERN, "start_id": ranks[b"\n"]}
    if several:  # documents end with GPT-2's end-of-text token, appended after the ranks; sampling starts a document
        fields |= {"eot": len(ranks), "start_id": len(ranks)}
    fields["bpe_ranks"] = ranks_to_text(ranks)
    tok = tokenizer_from_meta(fields)
    assert tok.encode(check) == encode_with_merges(check, merges), "tiktoken disagrees with the learned merges"
    return fields


def bpe_sample(corpus: Corpus, found: Scan, split: Split) -> tuple[collections.Counter, str]:
    """The pre-token counts of at most BPE_TRAIN_CHARS of train text, taken evenly across the split (all of it when
    it is smaller), and the first BPE_CHECK_CHARS characters of val."""
    counts, check = collections.Counter(), []
    taken = seen = checked = 0
    with progress_bar(corpus.nbytes, "bpe sample") as bar:
        for (name, _), text in chunks(split.pieces(corpus.pieces(bar.update))):
            if name == "train":
                if taken * found.chars <= seen * BPE_TRAIN_CHARS:  # behind its share so far
                    counts.update(pretokenize(text))
                    taken += len(text)
                seen += len(text)
            elif checked < BPE_CHECK_CHARS:
                check.append(text[: BPE_CHECK_CHARS - checked])
                checked += len(check[-1])
    return counts, "".join(check)


# ----------------------------------------------------------------------------- prepare


def write_splits(stage: Path, corpus: Corpus, split: Split, fields: dict, dtype: str, num_proc: int) -> dict:
    """The corpus encoded into stage/train.bin and stage/val.bin; [tokens, bytes of text] of each split."""
    outputs = {s: Stream(stage / f"{s}.bin") for s in SPLITS}
    sizes = {s: [0, 0] for s in SPLITS}
    read = 0

    def count(n):
        nonlocal read
        read += n

    with progress_bar(corpus.nbytes, "encoding") as bar:

        def write(task, ids, nbytes):
            outputs[task.split].write(memoryview(ids).cast("B"))  # the ids' bytes, without a copy
            sizes[task.split][0] += len(ids)
            sizes[task.split][1] += nbytes
            bar.update(task.read - bar.n)

        pieces = split.pieces(corpus.pieces(count))
        encode(tasks(chunks(pieces), lambda: read), fields, dtype, num_proc, write)
    for stream in outputs.values():
        stream.close()
    return sizes


def prepare(args: PrepareConfig) -> dict:
    t0 = time.time()
    out_dir = Path(args.data_dir) / args.dataset
    if args.input:
        corpus = Corpus(args.input)
    else:
        corpus_path = out_dir / "input.txt"
        if not corpus_path.is_file():
            out_dir.mkdir(parents=True, exist_ok=True)
            download(SHAKESPEARE_URL, corpus_path)
        corpus = Corpus(str(corpus_path))
    if args.tokenizer == "gpt2":
        gpt2_encoding()  # its files are there (or the one-line error), before reading a large corpus
    if args.tokenizer.startswith(HF_PREFIX):
        hf_tokenizer_fields(args.tokenizer.removeprefix(HF_PREFIX), f"tokenizer={args.tokenizer}")  # likewise
    found = scan(corpus, charset=args.tokenizer == "char")  # every file read and checked before anything is written
    split = Split.plan(found, args.val_fraction)
    fields = tokenizer_fields(args, corpus, found, split)
    vocab_size = tokenizer_from_meta(fields).vocab_size
    dtype = dtype_for_vocab(vocab_size)
    num_proc = args.num_proc or max(1, min(default_num_proc(), found.chars // PARALLEL_CHARS))
    print(
        f"{corpus.nbytes:,} bytes in {len(corpus.files):,} file(s), {split.documents:,} document(s); "
        f"encoding with {num_proc} process(es)"
    )

    # written beside out_dir and moved in when complete: a stopped prepare leaves the previous dataset as it was
    with staged_folder(out_dir, "meta.json", drop=(BPE_FILE, HF_FILE)) as stage:
        sizes = write_splits(stage, corpus, split, fields, dtype, num_proc)
        meta = {"dataset": args.dataset, "tokenizer": fields["tokenizer"], "vocab_size": vocab_size, "dtype": dtype}
        for s in SPLITS:
            meta[f"{s}_tokens"], meta[f"{s}_bytes"] = sizes[s]
        for inlined, file, key in (("bpe_ranks", BPE_FILE, "bpe_file"), ("hf_tokenizer", HF_FILE, "hf_file")):
            if inlined in fields:  # a file of its own; load_meta inlines it again
                content = fields.pop(inlined).encode("utf-8")
                atomic_write(stage / file, lambda f, content=content: f.write(content))
                fields[key] = file
        meta |= fields
        meta |= {"val_fraction": args.val_fraction, "source": corpus.source() if args.input else SHAKESPEARE_URL}
        if split.documents > 1:
            meta |= {"train_documents": split.documents - split.val_documents, "val_documents": split.val_documents}
        text = json.dumps(meta, indent=1, ensure_ascii=False) + "\n"
        atomic_write(stage / "meta.json", lambda f: f.write(text.encode("utf-8")))

    print(f"{out_dir}: {args.tokenizer} tokenizer, vocab {vocab_size}, ids {dtype}")
    for s in SPLITS:
        tokens, nbytes = meta[f"{s}_tokens"], meta[f"{s}_bytes"]
        print(f"  {s:5s} {tokens:>10,} tokens  {nbytes:>10,} bytes  {tokens / nbytes:.3f} tokens/byte")
    seconds = time.time() - t0
    print(f"  done in {seconds:.1f}s, {corpus.nbytes / 1e6 / seconds:.1f} MB/s of corpus")
    return meta


def main(argv: list[str] | None = None) -> int:
    """The exit status: 0; 1 for bad input or an unreachable resource (one line); 130 for a stop (Ctrl-C, SIGTERM)."""
    try:
        config.main(
            argv,
            __doc__,
            (PrepareConfig,),
            prepare,
            interrupted=lambda e: "\nstopped: no dataset was written, and one prepared before is as it was",
        )
    except SystemExit as e:
        return e.code
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a scheduler's stop cleans up as a Ctrl-C does
    sys.exit(main())
