"""Tests of data/: tokenizers, BPE training, prepare.py's CLI and the prepared-dataset format.

No test uses the network: subprocesses get proxies that refuse connections and an empty
tiktoken cache; in-process tests monkeypatch the download functions.
"""

import base64
import io
import itertools
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

from conftest import ROOT as REPO, FullDevice
from data import bpe, prepare, staging, tokenizer as tk
from data.loader import Batches

# whitespace runs, tabs, accents, CJK, emoji, a combining mark, a ZWJ sequence
TRICKY = (
    "Héllo,  wörld!\t\tTabs\n\n\n   spaces   \r\n日本語テキスト 🎉👩‍💻 e\u0301 x²=4 'tis we'll\u00a0nbsp <|endoftext|>"
)


def run_prepare(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """prepare.py as a user runs it, with the network made unreachable."""
    full_env = dict(os.environ)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        full_env[var] = "http://127.0.0.1:9"  # the discard port: connections are refused at once
    for var in ("no_proxy", "NO_PROXY"):
        full_env.pop(var, None)
    full_env |= env or {}
    return subprocess.run(
        [sys.executable, "-m", "data.prepare", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
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
    pieces = Counter(bpe.pretokenize(text))
    words, freqs = [list(p.encode("utf-8")) for p in pieces], list(pieces.values())
    vocab = [bytes([i]) for i in range(256)]
    merges = []
    while len(vocab) < vocab_size:
        counts = Counter()
        for word, freq in zip(words, freqs, strict=True):
            for pair in itertools.pairwise(word):
                counts[pair] += freq
        if not counts:
            break
        a, b = min(counts, key=lambda pair: (-counts[pair], pair))
        vocab.append(vocab[a] + vocab[b])
        merges.append((a, b, len(vocab) - 1))
        words = [bpe._merge_pair(word, a, b, len(vocab) - 1) for word in words]
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
    assert bpe.pretokenize(text) == regex.findall(r50k_pat_str, text)


def test_incremental_training_matches_naive_bpe():
    text = Path(__file__).read_text(encoding="utf-8")[:4000] + TRICKY
    _, merges = bpe.train_bpe(text, 330, progress=False)
    assert merges == naive_train_bpe(text, 330)


def test_tiktoken_applies_the_learned_merges(small_corpus):
    text = small_corpus.read_text(encoding="utf-8")
    ranks, merges = bpe.train_bpe(text[:60_000], 400, progress=False)
    encoding = tk.bpe_encoding(ranks)
    held_out = text[60_000:70_000] + TRICKY
    assert encoding.encode_ordinary(held_out) == bpe.encode_with_merges(held_out, merges)


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
    n = int(len(text) * 0.9)  # the last tenth of the characters is val
    for split, split_text in (("train", text[:n]), ("val", text[n:])):
        ids = tk.open_split(bpe_dataset, split, meta)
        assert len(ids) == meta[f"{split}_tokens"]
        assert tok.decode(ids.tolist()) == split_text


# ----------------------------------------------------------------------------- prepare (char)


def test_prepare_char_shakespeare(char_dataset, corpus):
    meta = json.loads((char_dataset / "meta.json").read_text(encoding="utf-8"))
    for field in (
        "dataset",
        "tokenizer",
        "vocab_size",
        "dtype",
        "train_tokens",
        "val_tokens",
        "train_bytes",
        "val_bytes",
        "chars",
        "start_id",
    ):
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
    proc = run_prepare(
        "--tokenizer",
        "gpt2",
        "--input",
        str(small_corpus),
        "--data_dir",
        str(tmp_path),
        env={"TIKTOKEN_CACHE_DIR": str(cache)},
    )
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
        (["--input", ok, "--vocab_size", "300"], ["vocab_size applies only to tokenizer=bpe"]),
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
    with pytest.raises(ValueError, match=r"python -m data.prepare --tokenizer bpe --data_dir"):
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


FIX = re.escape("the dataset is damaged; re-create it with `python -m data.prepare --tokenizer char --data_dir ")
DAMAGE = [  # (file, change, what the error says before the fix)
    ("meta.json", lambda p: p.write_text("{'vocab_size': 65}"), r"meta\.json is not valid JSON \(Expecting property"),
    ("meta.json", lambda p: p.write_text('{"vocab_size": 65}'), r"meta\.json lacks dataset, tokenizer, dtype"),
    (
        "meta.json",
        lambda p: p.write_text(p.read_text().replace('"uint16"', '"float32"')),
        r"meta\.json gives dtype='float32', not one of uint16, uint32",
    ),
    (
        "train.bin",
        truncate,
        r"train\.bin is 2,007,707 bytes, not a multiple of 2 \(the size of its uint16 ids\): "
        r"it is truncated",
    ),
    (
        "val.bin",
        lambda p: p.write_bytes(p.read_bytes()[:1000]),
        r"val\.bin holds 500 tokens where meta\.json says 111,540",
    ),
    (
        "train.bin",
        out_of_vocabulary,
        r"train\.bin holds token id 70, outside the vocabulary of 65 that meta\.json gives",
    ),
]


@pytest.mark.parametrize("name, change, says", DAMAGE, ids=[d[2][:40] for d in DAMAGE])
def test_a_damaged_dataset_is_refused_naming_the_file_and_the_fix(char_dataset, tmp_path, name, change, says):
    dataset = damage(char_dataset, tmp_path, name, change)
    with pytest.raises(ValueError, match=f"^{re.escape(str(dataset))}/{says}.*; {FIX}"):
        Batches(dataset, tk.load_meta(dataset), 32, 4, 0, "cpu", 1)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_prepare_stopped_by_a_full_disk_leaves_the_previous_dataset_as_it_was(
    corpus, char_dataset, tmp_path, monkeypatch, capsys
):
    dataset = damage(char_dataset, tmp_path, "meta.json", lambda p: None)  # a whole dataset, prepared before
    before = snapshot(dataset)
    monkeypatch.setattr(staging, "open", FullDevice("val.bin", room=1000), raising=False)
    assert prepare.main(["--input", str(corpus), "--data_dir", str(tmp_path), "--val_fraction", "0.2"]) == 1
    err = capsys.readouterr().err.strip()
    stage = tmp_path / ".shakespeare_char.tmp"
    assert re.fullmatch(
        rf"error: cannot write {stage}/val\.bin: the device is full \(No space left on device; "
        r"[\d.]+ \w+ free there\)",
        err,
    ), err
    assert snapshot(dataset) == before  # the dataset is whole, and the old one: nothing was moved in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shakespeare_char"]  # no temporary folder stays
    tk.load_meta(dataset)


def test_a_prepare_interrupted_while_encoding_leaves_the_previous_dataset(small_corpus, tmp_path, monkeypatch):
    argv = ["--input", str(small_corpus), "--data_dir", str(tmp_path), "--dataset", "mine"]
    assert prepare.main([*argv, "--tokenizer", "bpe", "--vocab_size", "300"]) == 0
    before = snapshot(tmp_path / "mine")
    calls = []

    def ctrl_c_on_the_second_task(self, segments):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return encode(self, segments)

    encode = prepare.Encoder.__call__
    monkeypatch.setattr(prepare, "CHUNK_CHARS", 10_000)
    monkeypatch.setattr(prepare.Encoder, "__call__", ctrl_c_on_the_second_task)
    assert prepare.main(argv) == 130
    assert snapshot(tmp_path / "mine") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    # done to the end, the new dataset replaces the old, files of the old tokenizer included
    monkeypatch.setattr(prepare.Encoder, "__call__", encode)
    assert prepare.main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["meta.json", "train.bin", "val.bin"]
    assert tk.load_meta(tmp_path / "mine")["tokenizer"] == "char"


# ----------------------------------------------------------------------------- streaming


def cut(text, target):
    return [chunk for _, chunk in prepare.chunks([(0, text)], target)]


def encodings(small_corpus):
    """char, our bpe, and the same ranks under tiktoken's gpt2 pattern (gpt2's own files are not here offline)."""
    from tiktoken_ext.openai_public import r50k_pat_str

    text = small_corpus.read_text(encoding="utf-8")[:30_000] + TRICKY
    ranks, _ = bpe.train_bpe(text, 400, progress=False)
    ours = tk.bpe_encoding(ranks)
    gpt2_like = tk.bpe_encoding(ranks, pattern=r50k_pat_str, eot=len(ranks))
    return {"bpe": ours.encode_ordinary, "gpt2 pattern": gpt2_like.encode_ordinary}


HARD = (
    TRICKY * 3
    + "  \n\n \t x  'll 's't 'S 12,345.6e7 ..."
    + "日本語のテキスト、句読点。" * 40
    + "\r\n" * 5
    + "a" * 300
    + "   "
    + "'" * 50
    + " \u00a0\u3000 end"
    + "x'  'x ''s"
    + "a\x1cb\x85 c\u2028\x0bd\x0c"
)


@pytest.mark.parametrize("target", [1, 7, 64, 500])
def test_text_cut_into_chunks_encodes_as_the_whole(small_corpus, target):
    text = HARD + small_corpus.read_text(encoding="utf-8")[:20_000]
    chunks = cut(text, target)
    assert "".join(chunks) == text and len(chunks) > len(text) // 1000
    for name, encode in encodings(small_corpus).items():
        streamed = [i for chunk in chunks for i in encode(chunk)]
        assert streamed == encode(text), name


def test_chunks_fed_in_pieces_of_any_size_match_the_whole(small_corpus):
    text = HARD + small_corpus.read_text(encoding="utf-8")[:10_000]
    rng = np.random.default_rng(0)
    ends = sorted(set(rng.integers(1, len(text), 200).tolist())) + [len(text)]
    pieces = [(0, text[a:b]) for a, b in itertools.pairwise([0, *ends])]
    chunks = [chunk for _, chunk in prepare.chunks(pieces, 50)]
    assert "".join(chunks) == text
    for name, encode in encodings(small_corpus).items():
        assert [i for chunk in chunks for i in encode(chunk)] == encode(text), name


def test_a_word_with_no_safe_cut_is_cut_only_past_the_limit(monkeypatch):
    monkeypatch.setattr(prepare, "MAX_CHUNK_CHARS", 1000)
    assert cut("a" * 900 + " b", 100) == ["a" * 900, " b"]  # a safe cut past the target is waited for
    # cut where it must, the one case where ids may differ, until the limit holds the rest
    assert [len(c) for c in cut("a" * 2500, 100)] == [100] * 15 + [1000]


def test_a_new_key_starts_a_new_chunk():
    pieces = [(("train", 0), "one two"), (("train", 0), " three"), (("val", 0), "four"), (("val", 1), "five")]
    assert list(prepare.chunks(pieces, 100)) == [
        (("train", 0), "one two three"),
        (("val", 0), "four"),
        (("val", 1), "five"),
    ]


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_streamed_dataset_holds_the_ids_of_the_whole_text(tmp_path, small_corpus, monkeypatch, tokenizer):
    text = HARD + small_corpus.read_text(encoding="utf-8")[:40_000]
    (tmp_path / "c.txt").write_text(text, encoding="utf-8", newline="")
    monkeypatch.setattr(prepare, "READ_BYTES", 1000)  # pieces, chunks and tasks of a few hundred characters
    monkeypatch.setattr(prepare, "CHUNK_CHARS", 300)
    extra = ["--vocab_size", "300"] if tokenizer == "bpe" else []
    assert (
        prepare.main(
            [
                "--input",
                str(tmp_path / "c.txt"),
                "--data_dir",
                str(tmp_path),
                "--dataset",
                "d",
                "--tokenizer",
                tokenizer,
                "--num_proc",
                "1",
                *extra,
            ]
        )
        == 0
    )
    meta = tk.load_meta(tmp_path / "d")
    tok, n = tk.tokenizer_from_meta(meta), int(len(text) * 0.9)
    for split, part in (("train", text[:n]), ("val", text[n:])):
        assert tk.open_split(tmp_path / "d", split, meta).tolist() == tok.encode(part)
        assert meta[f"{split}_bytes"] == len(part.encode("utf-8"))


def test_utf8_errors_give_the_offset_in_the_file_across_blocks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prepare, "READ_BYTES", 16)
    good = "é" * 20  # 2 bytes each: blocks of 16 bytes cut none, but a 15-byte start would
    (tmp_path / "a.txt").write_bytes(b"x" + good.encode() + b"\xff tail")
    assert prepare.main(["--input", str(tmp_path / "a.txt"), "--data_dir", str(tmp_path / "out")]) == 1
    assert "(byte 0xff at offset 41)" in capsys.readouterr().err
    (tmp_path / "b.txt").write_bytes(b"x" + good.encode() + b" tail\n")
    assert prepare.main(["--input", str(tmp_path / "b.txt"), "--data_dir", str(tmp_path / "out")]) == 0
    meta = tk.load_meta(tmp_path / "out" / "shakespeare_char")
    assert meta["train_bytes"] + meta["val_bytes"] == 47


# ----------------------------------------------------------------------------- corpora of many documents


DOCS = {  # path under the corpus folder: its documents
    "a/1.txt": ["First document,\nof two lines.\n"],
    "a/b/2.jsonl": ["second", "third <|endoftext|> has the literal", "fourth\n"],
    "c.txt": ["fifth and last, é\n"],
}


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "corpus"
    for name, docs in DOCS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            lines = [
                json.dumps({"text": docs[0], "id": 1}),
                "",
                json.dumps({"text": ""}),  # blank, empty: skipped
                *(json.dumps({"text": d}) for d in docs[1:]),
            ]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        else:
            path.write_text(docs[0], encoding="utf-8")
    (root / "notes.md").write_text("not a corpus file")
    return root


def docs_of(*names):
    return [d for name in names for d in DOCS[name]]


def prepared(root, dataset):
    meta = tk.load_meta(root / dataset)
    tok = tk.tokenizer_from_meta(meta)
    return meta, {s: tok.decode(tk.open_split(root / dataset, s, meta).tolist()) for s in tk.SPLITS}


def test_a_folder_is_its_txt_and_jsonl_files_in_sorted_order_one_document_each_line(folder, tmp_path):
    assert (
        prepare.main(["--input", str(folder), "--data_dir", str(tmp_path), "--dataset", "d", "--val_fraction", "0.4"])
        == 0
    )
    meta, text = prepared(tmp_path, "d")
    docs = docs_of("a/1.txt", "a/b/2.jsonl", "c.txt")
    # five documents, two val (round(5 * 0.4)), evenly spread: the third and the fifth; char joins with a newline
    assert (meta["train_documents"], meta["val_documents"]) == (3, 2)
    assert text["train"] == "\n".join([docs[0], docs[1], docs[3]])
    assert text["val"] == "\n".join([docs[2], docs[4]])
    assert meta["train_bytes"] == sum(len(docs[i].encode()) for i in (0, 1, 3))  # separators not counted
    assert meta["source"] == str(folder.resolve())


def test_a_glob_and_a_jsonl_file(folder, tmp_path):
    assert prepare.main(["--input", str(folder / "**" / "*.txt"), "--data_dir", str(tmp_path), "--dataset", "g"]) == 0
    meta, text = prepared(tmp_path, "g")
    assert (text["train"], text["val"]) == tuple(docs_of("a/1.txt", "c.txt"))  # two documents: one each
    assert meta["source"] == str(folder / "**" / "*.txt")
    assert prepare.main(["--input", str(folder / "a/b/2.jsonl"), "--data_dir", str(tmp_path), "--dataset", "j"]) == 0
    meta, text = prepared(tmp_path, "j")
    docs = docs_of("a/b/2.jsonl")
    assert text["train"] == "\n".join(docs[:2]) and text["val"] == docs[2]


def test_bpe_separates_documents_with_an_end_of_text_token(folder, tmp_path):
    assert (
        prepare.main(
            [
                "--input",
                str(folder),
                "--data_dir",
                str(tmp_path),
                "--dataset",
                "b",
                "--tokenizer",
                "bpe",
                "--vocab_size",
                "270",
                "--val_fraction",
                "0.4",
            ]
        )
        == 0
    )
    meta, text = prepared(tmp_path, "b")
    eot = meta["eot"]
    assert eot == 269 and meta["vocab_size"] == 270 and meta["start_id"] == eot  # --vocab_size counts it
    tok = tk.tokenizer_from_meta(meta)
    assert tok.vocab_size == 270 and tok.decode([eot]) == tk.GPT2_EOT
    docs = docs_of("a/1.txt", "a/b/2.jsonl", "c.txt")
    assert text["train"] == tk.GPT2_EOT.join([docs[0], docs[1], docs[3]])
    ids = tk.open_split(tmp_path / "b", "train", meta).tolist()
    assert ids.count(eot) == 2, "only the separators: the literal <|endoftext|> in a document is text"
    assert tok.encode(tk.GPT2_EOT) != [eot]
    # train.py and sample.py rebuild it from the checkpoint's copy of meta
    loaded = torch.load(io.BytesIO(_saved({"meta": meta})), weights_only=True)["meta"]
    assert tk.tokenizer_from_meta(loaded).decode(ids) == text["train"]


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("n, fraction", [(2, 0.1), (3, 0.5), (10, 0.1), (11, 0.25), (1000, 0.01), (7, 0.95)])
def test_the_val_documents_are_evenly_spread_and_never_all(n, fraction):
    split = prepare.Split.plan(prepare.Scan(documents=n, chars=10 * n), fraction)
    val = [k for k in range(n) if split.of(k) == "val"]
    assert len(val) == split.val_documents == min(n - 1, max(1, round(n * fraction)))
    assert val[-1] == n - 1 and max(np.diff([-1, *val])) <= -(-n // len(val))  # no gap wider than n / len(val)


def test_many_documents_prepare_the_same_with_several_processes(small_corpus, tmp_path):
    """Documents of a jsonl file and text files, spread over tasks that processes encode out of order."""
    text = small_corpus.read_text(encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    speeches = text.split("\n\n")
    with open(corpus / "speeches.jsonl", "w", encoding="utf-8") as f:
        for speech in speeches * 3:
            f.write(json.dumps({"text": speech}) + "\n")
    (corpus / "whole.txt").write_text(text * 2, encoding="utf-8")
    outputs = []
    for num_proc in ("1", "2"):
        root = tmp_path / num_proc
        proc = run_prepare(
            "--input",
            str(corpus),
            "--data_dir",
            str(root),
            "--tokenizer",
            "bpe",
            "--vocab_size",
            "300",
            "--num_proc",
            num_proc,
            env={"PYTHONHASHSEED": num_proc},
        )
        assert proc.returncode == 0, proc.stderr
        assert f"encoding with {num_proc} process(es)" in proc.stdout
        outputs.append(snapshot(root / "shakespeare_bpe"))
    assert outputs[0] == outputs[1]
    meta = json.loads(outputs[0]["meta.json"])
    assert meta["train_documents"] + meta["val_documents"] == 3 * len(speeches) + 1


def test_bad_corpora_are_one_line_errors(folder, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    lines = {
        "no_text.jsonl": '{"text": "ok"}\n{"body": "x"}\n',
        "not_json.jsonl": '{"text": "ok"}\n\n{"text": \n',
        "list.jsonl": '["text"]\n',
        "number.jsonl": '{"text": 3}\n',
        "latin1.jsonl": '{"text": "caf\xe9"}\n',
    }
    for name, content in lines.items():
        (tmp_path / "bad" / name).write_bytes(content.encode("latin-1"))
    (folder / "a" / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n\n')
    bad = tmp_path / "bad"
    cases = [
        (str(tmp_path / "empty"), "input folder", "empty holds no .txt or .jsonl files"),
        (str(tmp_path / "*.nothing"), "input pattern", "*.nothing' matches no files"),
        (str(bad / "no_text.jsonl"), 'no_text.jsonl line 2 has no "text" field'),
        (str(bad / "not_json.jsonl"), "not_json.jsonl line 3 is not valid JSON (Expecting value at column 10)"),
        (str(bad / "list.jsonl"), 'list.jsonl line 1 has no "text" field'),
        (str(bad / "number.jsonl"), 'number.jsonl line 1 has a "text" that is a int, not a string'),
        (str(bad / "latin1.jsonl"), "latin1.jsonl line 1 is not UTF-8 text (byte 0xe9 at column 14)"),
        (str(folder), "a/latin1.txt is not UTF-8 text (byte 0xe9 at offset 6)"),
        (str(tmp_path / "blank.jsonl"), "blank.jsonl holds no text"),
    ]
    for spec, *fragments in cases:
        assert prepare.main(["--input", spec, "--data_dir", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        assert all(f in err for f in fragments), (fragments, err)
    (folder / "a" / "latin1.txt").unlink()
    for argv, says in [
        (["--num_proc", "0"], "num_proc=0 must be a positive integer"),
        (["--tokenizer", "bpe", "--vocab_size", "257"], "needs 258.."),
    ]:
        assert prepare.main(["--input", str(folder), "--data_dir", str(tmp_path / "out"), *argv]) == 1
        assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
