"""trackers.py: --log=tensorboard and --log=wandb (offline) get what metrics.jsonl gets, read back from their own
files; a missing or broken package or an unknown tracker is one line."""

import json
import struct
import sys

import pytest

import train
from conftest import ONE_THREAD, flags, log, run

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = ["--max_iters=4", "--eval_interval=2", "--log_interval=1"]


def logged(out, key):
    return {m["iter"]: m[key] for m in log(out) if key in m}


def test_tensorboard_event_files_hold_the_metrics(data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train.main(flags(data_dir, out, *RUN, "--log=tensorboard"))
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    for key in ("train_loss", "val_loss", "lr", "grad_norm", "elapsed_s"):
        assert {e.step: e.value for e in events.Scalars(key)} == pytest.approx(logged(out, key), rel=1e-6), key


def wandb_history(path):
    """The history rows of a .wandb file: a LevelDB-style log (32 KiB blocks, records cut into FULL, FIRST, MIDDLE,
    LAST pieces with a 7-byte header) of wandb's protobuf Records after a 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2

    data, pos, piece, rows = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the padding at a block's end
            pos += left
            continue
        piece, pos = piece + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a record's FULL or LAST piece
            record = wandb_internal_pb2.Record.FromString(piece)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            piece = b""
    return rows


def test_wandb_offline_run_holds_the_metrics_and_a_resume_continues_it(data_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train.main(flags(data_dir, out, *RUN, "--log=wandb"))
    run_id = (out / "wandb_id").read_text()
    train.main(
        flags(data_dir, out, "--max_iters=6", "--eval_interval=2", "--log_interval=1", "--log=wandb", "--resume")
    )
    # offline, each process writes a folder of its own under the one run id, which `wandb sync` joins into one run
    rows = [
        row
        for f in sorted((out / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))
        for row in wandb_history(f)
    ]
    for key in ("train_loss", "val_loss", "lr", "elapsed_s"):
        assert {row["_step"]: row[key] for row in rows if key in row} == pytest.approx(logged(out, key)), key
    assert [row["_step"] for row in rows] == list(range(1, 7))


def test_an_unknown_tracker_or_a_missing_package_is_one_line(monkeypatch):
    with pytest.raises(ValueError, match="log='mlflow' is unknown; choose one of none, wandb, tensorboard"):
        train.TrainConfig(log="mlflow")
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an import then meets: no such module
    with pytest.raises(
        ValueError, match="log=wandb needs the wandb package, which is not installed: pip install wandb"
    ):
        train.TrainConfig(log="wandb")


def broken_package(root, name, error):
    """A package name under root whose import raises error, as a broken install's does."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"raise {error}\n")
    return root


@pytest.mark.parametrize(
    "error",
    [
        "ImportError('libfoo.so: cannot open shared object file')",
        "AttributeError(\"module 'numpy' has no attribute 'float'\")",
        "OSError(5, 'Input/output error')",
        "ModuleNotFoundError(\"No module named 'foo'\", name='foo')",
    ],
    ids=["ImportError", "AttributeError", "OSError", "a dependency missing"],
)
def test_a_tracker_whose_package_is_installed_but_broken_is_one_line_naming_it(tmp_path, monkeypatch, error):
    monkeypatch.syspath_prepend(str(broken_package(tmp_path, "wandb", error)))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    kind = error.partition("(")[0]
    with pytest.raises(
        ValueError,
        match=rf"^log=wandb needs the wandb package, which is installed but fails to import "
        rf"\({kind}: .+\); reinstall it: pip install wandb$",
    ):
        train.TrainConfig(log="wandb")


def test_a_broken_tensorboard_stops_train_py_in_one_line_before_anything_is_written(data_dir, tmp_path):
    fake = broken_package(tmp_path / "site", "tensorboard", "OSError(5, 'Input/output error')")
    out = tmp_path / "run"
    proc = run(
        "train.py",
        *flags(data_dir, out, *RUN, "--log=tensorboard"),
        check=False,
        env={**ONE_THREAD, "PYTHONPATH": str(fake)},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and not out.exists()
    assert proc.stderr == (
        "error: log=tensorboard needs the tensorboard package, which is installed but fails to "
        "import (OSError: [Errno 5] Input/output error); reinstall it: pip install tensorboard\n"
    )


def test_wandb_without_credentials_fails_before_anything_is_written(data_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc holding a key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main(flags(data_dir, out, *RUN, "--log=wandb"))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1
    assert err.startswith("error: log=wandb: not logged in to Weights & Biases; run `wandb login`, or set WANDB_MODE")
    assert not out.exists()
