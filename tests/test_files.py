"""files.py: atomic writes on a full or read-only device, appended log lines, and the run lock across processes."""

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

import files
from checkpoint import save_checkpoint
from conftest import ONE_THREAD, ROOT, FullDevice


def test_a_full_device_keeps_the_previous_file_and_says_what_the_new_one_needed(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"v": 1}, path)
    monkeypatch.setattr(files, "open", FullDevice(".ckpt.pt.tmp", room=100), raising=False)
    big = {"w": torch.zeros(5000)}
    with pytest.raises(files.WriteError) as e:
        save_checkpoint(big, path)
    needed = len(save_bytes(big))
    assert str(e.value).startswith(
        f"cannot write {path}: the device is full (No space left on device; it needs {files.size(needed)}, "
    )
    assert str(e.value).endswith(" free there)") and "\n" not in str(e.value)
    assert torch.load(path, weights_only=True) == {"v": 1} and os.listdir(tmp_path) == ["ckpt.pt"]


def save_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_read_only_device_is_one_line_and_nothing_changes(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("old")
    monkeypatch.setattr(files, "open", FullDevice(".config.json.tmp", error=errno.EROFS), raising=False)
    with pytest.raises(files.WriteError, match=r"cannot write .*config\.json: the device is read-only"):
        files.atomic_write(path, lambda f: f.write(b"new"))
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["config.json"]


def test_a_log_line_that_does_not_fit_is_a_write_error(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "open", FullDevice("metrics.jsonl", room=10), raising=False)
    with files.open_log(tmp_path / "metrics.jsonl") as f, pytest.raises(files.WriteError, match="device is full"):
        files.append_line(f, json.dumps({"iter": 1, "train_loss": 4.2}))


HOLD = """
import sys, time
import files
with files.RunLock(sys.argv[1], "test run"):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_the_run_lock_refuses_a_second_process_until_the_holder_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, env=ONE_THREAD, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with (
            pytest.raises(
                ValueError,
                match=rf"{tmp_path} is in use by another test run \(pid {holder.pid}, "
                r"started .*: -c .*\); wait for it to finish",
            ),
            files.RunLock(tmp_path, "test run"),
        ):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with files.RunLock(tmp_path, "test run"):  # a killed holder leaves its file, but no lock
        assert json.loads((tmp_path / files.LOCK_FILE).read_text())["pid"] == os.getpid()


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")

    def interrupted(f):
        f.write(b"half")
        raise KeyboardInterrupt  # a second Ctrl-C during a checkpoint write

    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(path, interrupted)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_metrics_log_skips_a_torn_last_line_and_names_any_other_damage(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = ['{"iter": 1, "train_loss": 4.0}', '{"iter": 2, "train_loss": 3.5}']
    path.write_text("\n".join(good) + '\n{"iter": 3, "tra')  # what a crash mid-write leaves
    assert [m["iter"] for m in files.read_log(path)] == [1, 2]
    files.trim_log(path, 1)
    assert path.read_text() == good[0] + "\n"
    for garbage in ("not json", "[1, 2]", '{"train_loss": 3.0}', '{"iter": "2"}'):  # each in the middle
        path.write_text("\n".join([good[0], garbage, good[1]]) + "\n")
        for read in (files.read_log, lambda p: files.trim_log(p, 2)):
            with pytest.raises(
                ValueError,
                match=rf"^{re.escape(str(path))} is damaged: line 2 is not a metrics line "
                rf"\({re.escape(repr(garbage))}\); delete that line",
            ):
                read(path)
    path.write_bytes(b'{"iter": 1}\n\xff\xfe\n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))} is damaged: it is not text"):
        files.read_log(path)
