"""Tests of data/: tokenizers, BPE training, prepare.py's CLI and the prepared-dataset format.

No test uses the network: subprocesses get proxies that refuse connections and an empty
tiktoken cache; in-process tests monkeypatch the download functions.
"""

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import regex
import requests
import tiktoken
import tiktoken.load
import torch

from conftest import ROOT as REPO
import files
from conftest import FullDevice
from data import prepare
from data import tokenizer as tk
from data.loader import Batches

# whitespace runs, tabs, accents, CJK, emoji, a combining mark, a ZWJ sequence
TRICKY = ("Héllo,  wörld!\t\tTabs\n\n\n   spaces   \r\n日本語テキスト 🎉👩‍💻 e\u0301 x²=4 "
          "'tis we'll\u00a0nbsp <|endoftext|>")


def run_prepare(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """prepare.py as a user runs it, with the network made unreachable."""
    full_env = dict(os.environ)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        full_env[var] = "http://127.0.0.1:9"  # the discard port: connections are refused at once
    for var in ("no_proxy", "NO_PROXY"):
        full_env.pop(var, None)
    full_env |= env or {}
    return subprocess.run(
        [sys.executable, "data/prepare.py", *args],
        cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def naive_train_bpe(text: str, vocab_size: int) -> list[tuple[int, int, int]]:
    """Textbook BPE: recount every pair after every merge. Slow but obviously right."""
    pieces = Counter(tk.pretokenize(text))
    words, freqs = [list(p.encode("utf-8")) for p in pieces], list(pieces.values())
    vocab = [bytes([i]) for i in range(256)]
    merges = []
    while len(vocab) < vocab_size:
        counts = Counter()
        for word, freq in zip(words, freqs):
            for pair in zip(word, word[1:]):
                counts[pair] += freq
        if not counts:
            break
        a, b = min(counts, key=lambda pair: (-counts[pair], pair))
        vocab.append(vocab[a] + vocab[b])
        merges.append((a, b, len(vocab) - 1))
        words = [tk._merge_pair(word, a, b, len(vocab) - 1) for word in words]
    return merges


@pytest.fixture(scope="module")
def small_corpus(corpus, tmp_path_factory) -> Path:
    """The first 100 kB of tiny Shakespeare, as a corpus file."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text(corpus.read_text(encoding="utf-8")[:100_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bpe_dataset(small_corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    argv = ["--tokenizer", "bpe", "--vocab_size", "512", "--input", str(small_corpus)]
    assert prepare.main([*argv, "--data_dir", str(root)]) == 0
    return root / "shakespeare_bpe"


@pytest.fixture(scope="module")
def char_dataset(corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    proc = run_prepare("--input", str(corpus), "--data_dir", str(root))
    assert proc.returncode == 0, proc.stderr
    return root / "shakespeare_char"


# ----------------------------------------------------------------------------- char


def test_char_roundtrip_and_unknown_characters():
    tok = tk.CharTokenizer(sorted(set("abc \t\nXYZ!")))
    text = "abc  \t\tXYZ\n\n!a"
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError) as err:
        tok.encode("abc é日é 日🎉")
    msg = str(err.value)
    assert "'é'" in msg and "'日'" in msg and "'🎉'" in msg and "char-level" in msg
    assert msg.count("'é'") == 1, "unknown characters are listed once each"
    with pytest.raises(ValueError, match=r"and 5 more"):
        tok.encode("".join(chr(0x4E00 + i) for i in range(15)))


# ----------------------------------------------------------------------------- bpe


def test_pattern_splits_like_tiktoken_gpt2():
    from tiktoken_ext.openai_public import r50k_pat_str  # gpt2's pattern; importing it needs no network

    text = TRICKY + " I'M  don't\n\n  x  \n" + Path(__file__).read_text(encoding="utf-8")[:3000]
    assert tk.pretokenize(text) == regex.findall(r50k_pat_str, text)


def test_incremental_training_matches_naive_bpe():
    text = Path(__file__).read_text(encoding="utf-8")[:4000] + TRICKY
    _, merges = tk.train_bpe(text, 330, progress=False)
    assert merges == naive_train_bpe(text, 330)


def test_tiktoken_applies_the_learned_merges(small_corpus):
    text = small_corpus.read_text(encoding="utf-8")
    ranks, merges = tk.train_bpe(text[:60_000], 400, progress=False)
    encoding = tk.bpe_encoding(ranks)
    held_out = text[60_000:70_000] + TRICKY
    assert encoding.encode_ordinary(held_out) == tk.encode_with_merges(held_out, merges)


def test_bpe_roundtrips_any_text(bpe_dataset):
    tok = tk.tokenizer_from_meta(tk.load_meta(bpe_dataset))
    unseen = "Ελληνικά ∮ E⋅da = Q, ¿qué? 🦀 \x00\x7f \u2028 end"
    for text in (TRICKY, unseen, "", " ", "\n", "a" * 1000):
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 512


def test_bpe_training_is_deterministic_across_processes(small_corpus, tmp_path):
    outputs = []
    for seed in ("1", "2"):  # string hashing differs between the runs
        root = tmp_path / seed
        args = ("--tokenizer", "bpe", "--vocab_size", "400", "--input", str(small_corpus))
        proc = run_prepare(*args, "--data_dir", str(root), env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        files = ("bpe.tiktoken", "train.bin", "val.bin")
        outputs.append([(root / "shakespeare_bpe" / f).read_bytes() for f in files])
    assert outputs[0] == outputs[1]


def test_bpe_compresses_held_out_text(bpe_dataset):
    meta = tk.load_meta(bpe_dataset)
    assert meta["val_tokens"] / meta["val_bytes"] < 0.6
    # counted independently: the val split's UTF-8 bytes over its stored token ids
    val_ids = tk.open_split(bpe_dataset, "val", meta)
    val_text = tk.tokenizer_from_meta(meta).decode(val_ids.tolist())
    assert tk.bytes_per_token(meta, "val") == len(val_text.encode("utf-8")) / len(val_ids)


def test_ranks_file_is_tiktoken_format(bpe_dataset, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no caching of the file by path
    meta = tk.load_meta(bpe_dataset)
    ranks = tiktoken.load.load_tiktoken_bpe(str(bpe_dataset / meta["bpe_file"]))
    assert ranks == tk.ranks_from_text(meta["bpe_ranks"])
    assert sorted(ranks.values()) == list(range(512))
    assert all(ranks[bytes([i])] == i for i in range(256))
    first_line = meta["bpe_ranks"].splitlines()[0].split()
    assert base64.b64decode(first_line[0]) == b"\x00" and first_line[1] == "0"


def test_bpe_meta_and_bins(bpe_dataset, small_corpus):
    meta = tk.load_meta(bpe_dataset)
    tok = tk.tokenizer_from_meta(meta)
    assert meta["tokenizer"] == "bpe" and meta["dtype"] == "uint16" and meta["vocab_size"] == 512
    assert tok.decode([meta["start_id"]]) == "\n"
    text = small_corpus.read_text(encoding="utf-8")
    train, val = prepare.split_text(text, 0.1)
    for split, split_text in (("train", train), ("val", val)):
        ids = tk.open_split(bpe_dataset, split, meta)
        assert len(ids) == meta[f"{split}_tokens"]
        assert tok.decode(ids.tolist()) == split_text


# ----------------------------------------------------------------------------- prepare (char)


def test_prepare_char_shakespeare(char_dataset, corpus):
    meta = json.loads((char_dataset / "meta.json").read_text(encoding="utf-8"))
    for field in ("dataset", "tokenizer", "vocab_size", "dtype", "train_tokens", "val_tokens",
                  "train_bytes", "val_bytes", "chars", "start_id"):
        assert field in meta, field
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == 65 and len(meta["chars"]) == 65
    assert (meta["train_tokens"], meta["val_tokens"]) == (1003854, 111540)
    assert meta["dtype"] == "uint16"
    assert meta["chars"][meta["start_id"]] == "\n"
    text = corpus.read_text(encoding="utf-8")
    tok = tk.tokenizer_from_meta(tk.load_meta(char_dataset))
    train = tk.open_split(char_dataset, "train", meta)
    val = tk.open_split(char_dataset, "val", meta)
    assert train.dtype == np.uint16 and val.dtype == np.uint16
    assert (char_dataset / "train.bin").stat().st_size == 2 * 1003854
    assert tok.decode(train.tolist()) + tok.decode(val.tolist()) == text
    assert tok.decode(val.tolist()) == text[1003854:]


def test_meta_survives_checkpoint_round_trip(char_dataset, bpe_dataset, tmp_path):
    for dataset in (char_dataset, bpe_dataset):
        meta = tk.load_meta(dataset)
        path = tmp_path / "ckpt.pt"
        torch.save({"meta": meta, "w": torch.zeros(2)}, path)
        loaded = torch.load(path, weights_only=True)["meta"]
        assert loaded == meta
        before, after = tk.tokenizer_from_meta(meta), tk.tokenizer_from_meta(loaded)
        assert after.name == before.name and after.vocab_size == before.vocab_size
        text = "First Citizen:\nBefore we proceed"
        assert after.encode(text) == before.encode(text) and after.decode(after.encode(text)) == text


# ----------------------------------------------------------------------------- prepare errors


def test_gpt2_offline_fails_with_one_line(tmp_path, small_corpus):
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    proc = run_prepare("--tokenizer", "gpt2", "--input", str(small_corpus), "--data_dir", str(tmp_path),
                       env={"TIKTOKEN_CACHE_DIR": str(cache)})
    assert_one_line_error(proc, "TIKTOKEN_CACHE_DIR", "--tokenizer bpe")


def test_gpt2_offline_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))

    def no_network(*args, **kwargs):
        raise requests.exceptions.ConnectionError("network disabled by the test")

    monkeypatch.setattr(requests, "get", no_network)
    with pytest.raises(ValueError, match="TIKTOKEN_CACHE_DIR"):
        tk.tokenizer_from_meta({"tokenizer": "gpt2"})


def test_download_offline_says_use_input(tmp_path):
    proc = run_prepare("--data_dir", str(tmp_path))
    assert_one_line_error(proc, "--input PATH", prepare.SHAKESPEARE_URL)
    assert not (tmp_path / "shakespeare_char" / "input.txt").exists(), "a failed download must not be cached"


def test_download_is_cached(tmp_path, monkeypatch):
    body = "To be, or not to be\nthat is the question:\n" * 50
    calls = []

    def fake_urlopen(url, timeout):
        calls.append(url)
        resp = io.BytesIO(body.encode("utf-8"))
        resp.headers = {"Content-Length": str(len(body))}
        return resp

    monkeypatch.setattr(prepare.urllib.request, "urlopen", fake_urlopen)
    for _ in range(2):
        assert prepare.main(["--data_dir", str(tmp_path)]) == 0
    assert calls == [prepare.SHAKESPEARE_URL]
    assert (tmp_path / "shakespeare_char" / "input.txt").read_text(encoding="utf-8") == body


def _bad_inputs(tmp: Path) -> list[tuple[list[str], list[str]]]:
    (tmp / "empty.txt").write_bytes(b"")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "nul.txt").write_bytes(b"text\x00\x00\x00more text")
    (tmp / "ok.txt").write_text("hello world\n" * 20, encoding="utf-8")
    ok = str(tmp / "ok.txt")
    return [
        (["--input", str(tmp / "missing.txt")], ["missing.txt", "does not exist"]),
        (["--input", str(tmp / "empty.txt")], ["empty.txt", "empty"]),
        (["--input", str(tmp / "binary.bin")], ["binary.bin", "not UTF-8"]),
        (["--input", str(tmp / "nul.txt")], ["nul.txt", "binary"]),
        (["--input", ok, "--tokenizer", "bpe", "--vocab_size", "256"], ["256", "257"]),
        (["--input", ok, "--tokenizer", "bpe", "--vocab_size", "10000000"], ["10000000", "257"]),
        (["--input", ok, "--vocab_size", "300"], ["--vocab_size", "bpe"]),
        (["--input", ok, "--val_fraction", "1.5"], ["1.5", "between 0 and 1"]),
        (["--input", ok, "--dataset", "a/b"], ["a/b", "folder name"]),
    ]


def test_bad_input_is_one_line_error(tmp_path):
    for args, fragments in _bad_inputs(tmp_path):
        proc = run_prepare(*args, "--data_dir", str(tmp_path / "out"))
        assert_one_line_error(proc, *fragments)
    assert not (tmp_path / "out").exists(), "bad input must not create the dataset folder"


def test_unknown_tokenizer_is_rejected(tmp_path):
    proc = run_prepare("--tokenizer", "sentencepiece", "--data_dir", str(tmp_path))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "sentencepiece" in proc.stderr and "char" in proc.stderr and "bpe" in proc.stderr


# ----------------------------------------------------------------------------- format helpers


def test_dtype_for_vocab():
    assert tk.dtype_for_vocab(65) == "uint16"
    assert tk.dtype_for_vocab(50257) == "uint16"
    assert tk.dtype_for_vocab(2**16) == "uint16"  # ids 0..65535 still fit
    assert tk.dtype_for_vocab(2**16 + 1) == "uint32"
    assert tk.dtype_for_vocab(100_277) == "uint32"


def test_missing_dataset_errors_say_how_to_prepare(tmp_path):
    with pytest.raises(ValueError, match=r"python data/prepare.py --tokenizer bpe --data_dir"):
        tk.load_meta(tmp_path / "shakespeare_bpe")
    (tmp_path / "mine").mkdir()
    meta = {"dtype": "uint16"}
    with pytest.raises(ValueError, match=r"train\.bin.*--dataset mine --input PATH"):
        tk.open_split(tmp_path / "mine", "train", meta)
    with pytest.raises(ValueError, match="valid: train, val"):
        tk.open_split(tmp_path / "mine", "test", meta)
    with pytest.raises(ValueError, match="load_meta"):
        tk.tokenizer_from_meta({"tokenizer": "bpe"})


# ----------------------------------------------------------------------------- damaged datasets

def damage(char_dataset, tmp_path, name, change):
    """A copy of the char dataset with one file changed by change(path); its folder."""
    copy = tmp_path / "shakespeare_char"
    shutil.copytree(char_dataset, copy)
    change(copy / name)
    return copy


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)


def out_of_vocabulary(path):
    with open(path, "r+b") as f:
        f.write(np.array([70], dtype=np.uint16).tobytes())  # 65 characters in the vocabulary


FIX = re.escape("the dataset is damaged; re-create it with `python data/prepare.py --tokenizer char --data_dir ")
DAMAGE = [  # (file, change, what the error says before the fix)
    ("meta.json", lambda p: p.write_text("{'vocab_size': 65}"), r"meta\.json is not valid JSON \(Expecting property"),
    ("meta.json", lambda p: p.write_text('{"vocab_size": 65}'), r"meta\.json lacks dataset, tokenizer, dtype"),
    ("meta.json", lambda p: p.write_text(p.read_text().replace('"uint16"', '"float32"')),
     r"meta\.json gives dtype='float32', not one of uint16, uint32"),
    ("train.bin", truncate, r"train\.bin is 2,007,707 bytes, not a multiple of 2 \(the size of its uint16 ids\): "
                            r"it is truncated"),
    ("val.bin", lambda p: p.write_bytes(p.read_bytes()[:1000]),
     r"val\.bin holds 500 tokens where meta\.json says 111,540"),
    ("train.bin", out_of_vocabulary, r"train\.bin holds token id 70, outside the vocabulary of 65 that meta\.json gives"),
]


@pytest.mark.parametrize("name, change, says", DAMAGE, ids=[d[2][:40] for d in DAMAGE])
def test_a_damaged_dataset_is_refused_naming_the_file_and_the_fix(char_dataset, tmp_path, name, change, says):
    dataset = damage(char_dataset, tmp_path, name, change)
    with pytest.raises(ValueError, match=f"^{re.escape(str(dataset))}/{says}.*; {FIX}"):
        Batches(dataset, tk.load_meta(dataset), 32, 4, 0, "cpu", 1)


def test_a_prepare_stopped_by_a_full_disk_leaves_no_dataset_train_would_accept(corpus, char_dataset, tmp_path,
                                                                              monkeypatch, capsys):
    dataset = damage(char_dataset, tmp_path, "meta.json", lambda p: None)  # a whole dataset, prepared before
    monkeypatch.setattr(files, "open", FullDevice(".val.bin.tmp", room=1000), raising=False)
    assert prepare.main(["--input", str(corpus), "--data_dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(rf"error: cannot write {dataset}/val\.bin: the device is full \(No space left on device; "
                        r"it needs 217\.9 KiB, [\d.]+ \w+ free there\)", err), err
    assert sorted(p.name for p in dataset.iterdir()) == ["train.bin", "val.bin"]  # no meta.json: not a dataset
    with pytest.raises(ValueError, match=r"no prepared dataset at .* \(meta\.json is missing\); create it with"):
        tk.load_meta(dataset)
