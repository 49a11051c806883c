"""plot.py: one or several runs' loss curves to a PNG; bad runs are one line."""

import shutil

import pytest

import plot
import train
from conftest import ONE_THREAD, flags, run


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("plotruns")
    for scheme in ("rope", "alibi"):
        train.main(
            flags(
                data_dir, root / scheme, f"--pos_emb={scheme}", "--max_iters=6", "--eval_interval=3", "--log_interval=1"
            )
        )
    return root


def test_a_run_is_labelled_with_its_scheme_and_a_torn_line_is_skipped(runs, tmp_path):
    run = shutil.copytree(runs / "rope", tmp_path / "rope")  # a copy: the other tests read the run whole
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"iter": 7, "train')  # what a crash mid-write leaves
    label, lines = plot.read_run(run)
    assert label == "rope (rope)" and [m["iter"] for m in lines] == [1, 2, 3, 4, 5, 6]
    assert [m["iter"] for m in lines if "val_loss" in m] == [3, 6]


def test_runs_are_drawn_to_a_png(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot.main([f"--runs={runs / 'rope'}"])
    assert (runs / "rope" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the run's own folder
    plot.main([f"--runs={runs / 'rope'},{runs / 'alibi'}", f"--out={tmp_path / 'both.png'}"])
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {runs / 'rope' / 'loss.png'}",
        f"wrote {tmp_path / 'both.png'}",
    ]


def test_a_folder_without_a_run_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.jsonl").write_text("")
    for folder, says in (("empty", "no metrics.jsonl in"), ("fresh", "holds no logged step yet")):
        with pytest.raises(SystemExit) as e:
            plot.main([f"--runs={tmp_path / folder}"])
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.startswith("error: ") and says in err and err.count("\n") == 1


def test_a_damaged_log_or_a_broken_matplotlib_is_one_line_naming_it(runs, tmp_path):
    folder = shutil.copytree(runs / "rope", tmp_path / "rope")
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    (folder / "metrics.jsonl").write_text("\n".join([*lines[:2], "garbage", *lines[2:]]) + "\n")
    proc = run("plot.py", f"--runs={folder}", check=False, env=ONE_THREAD)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {folder / 'metrics.jsonl'} is damaged: line 3 is not a "
        "metrics line ('garbage'); delete that line, or the file to start "
        "its log afresh\n"
    )
    (tmp_path / "site" / "matplotlib").mkdir(parents=True)
    (tmp_path / "site" / "matplotlib" / "__init__.py").write_text("raise ImportError('libpng16.so.16: cannot open')\n")
    proc = run(
        "plot.py",
        f"--runs={runs / 'rope'}",
        f"--out={tmp_path / 'x.png'}",
        check=False,
        env={**ONE_THREAD, "PYTHONPATH": str(tmp_path / "site")},
    )
    assert proc.returncode == 1 and proc.stderr == (
        "error: plot.py needs the matplotlib package, which is installed but fails to import (ImportError: "
        'libpng16.so.16: cannot open); reinstall it: pip install matplotlib (or pip install -e ".[plots]")\n'
    )
