"""data/staging.py: a staged folder appears whole or leaves the old one, and a stream that fills the device is one
WriteError."""

import os

import pytest

import files
from conftest import FullDevice
from data import staging


def contents(folder):
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_a_staged_folder_appears_whole_or_replaces_its_files_with_the_last_one_moved_in_last(tmp_path, monkeypatch):
    target = tmp_path / "dataset"
    with staging.staged_folder(target, "meta.json") as stage:
        assert stage == tmp_path / ".dataset.tmp" and not target.exists()
        for name in ("train.bin", "bpe.tiktoken", "meta.json"):
            (stage / name).write_text(f"old {name}")
    assert contents(target) == {
        "bpe.tiktoken": "old bpe.tiktoken",
        "meta.json": "old meta.json",
        "train.bin": "old train.bin",
    }
    (target / "input.txt").write_text("a cached corpus")
    moves = []
    replace = os.replace
    monkeypatch.setattr(
        staging.os, "replace", lambda a, b: (moves.append((b.name, (target / "meta.json").exists())), replace(a, b))
    )
    with staging.staged_folder(target, "meta.json", drop=("bpe.tiktoken",)) as stage:
        for name in ("meta.json", "train.bin"):
            (stage / name).write_text(f"new {name}")
    # bpe.tiktoken, of the old set, is dropped; input.txt, not the stage's to replace, stays
    assert contents(target) == {
        "input.txt": "a cached corpus",
        "meta.json": "new meta.json",
        "train.bin": "new train.bin",
    }
    assert moves == [("train.bin", False), ("meta.json", False)]  # meta.json away until the others are in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


@pytest.mark.parametrize("stop", [ValueError("bad input"), KeyboardInterrupt()])
def test_a_staged_folder_that_fails_leaves_the_old_folder_and_no_stage(tmp_path, stop):
    target = tmp_path / "dataset"
    target.mkdir()
    (target / "meta.json").write_text("old")
    (tmp_path / ".dataset.tmp").mkdir()  # left by a run that was killed
    (tmp_path / ".dataset.tmp" / "stale").write_text("x")
    with pytest.raises(type(stop)), staging.staged_folder(target, "meta.json") as stage:
        assert not (stage / "stale").exists()
        (stage / "meta.json").write_text("new")
        raise stop
    assert contents(target) == {"meta.json": "old"} and sorted(os.listdir(tmp_path)) == ["dataset"]


def test_a_stream_that_fills_the_device_is_a_write_error(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "open", FullDevice("train.bin", room=10), raising=False)
    stream = staging.Stream(tmp_path / "train.bin")
    stream.write(b"12345")
    with pytest.raises(files.WriteError, match=r"cannot write .*train\.bin: the device is full .* free there\)$"):
        stream.write(b"67890abc")
