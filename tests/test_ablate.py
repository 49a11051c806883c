"""lab/ablate.py: the grid end to end (every output, skip on rerun, resume after Ctrl-C, N/A past L0)."""

import csv
import importlib.util
import json
import os
import signal
from types import SimpleNamespace

import pytest

import files
import train
from conftest import TINY, run
from lab import ablate, ablate_report
from model import GPTConfig

# 2 schemes x 2 seeds of a tiny model, a few steps; L0 = 32, scored at 16, 32 and 64 tokens
GRID = [*TINY, "--schemes=rope,learned", "--seeds=2", "--more_seeds=0", "--max_iters=4", "--eval_interval=2",
        "--log_interval=2", "--eval_lengths=0.5,1,2", "--eval_tokens=128", "--sample_tokens=8", "--recall_share=0.5",
        "--recall_pairs=2", "--probe_lengths=0.5,1,2", "--probe_depths=0,1", "--probe_trials=2"]


def has_matplotlib():
    return importlib.util.find_spec("matplotlib") is not None


def ablate_main(capsys, *args):
    """ablate.main in-process: (exit code, stdout, stderr)."""
    try:
        ablate.main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_grid_writes_every_output_and_a_rerun_skips_finished_runs(data_dir, tmp_path, capsys):
    out = tmp_path / "abl"
    args = ["lab/ablate.py", *GRID, f"--data_dir={data_dir}", f"--out_dir={out}"]
    first = run(*args)
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["learned-seed1337", "learned-seed1338", "rope-seed1337", "rope-seed1338"]
    for r in runs:
        files = {p.name for p in (out / "runs" / r).iterdir()}
        assert {"ckpt.pt", "metrics.jsonl", "config.json", "summary.json", "eval.json"} <= files
    # fairness: the schemes of a seed train with identical settings (hence batches); seeds differ in the seed alone
    settings = {r: json.loads((out / "runs" / r / "summary.json").read_text())["settings"]["train"] for r in runs}
    assert settings["rope-seed1337"] == settings["learned-seed1337"]
    assert {k for k, v in settings["rope-seed1337"].items() if settings["rope-seed1338"][k] != v} == {"seed"}
    plots = ["val_loss.png", "loss_vs_length.png", "loss_vs_position.png"]
    if has_matplotlib():
        assert all((out / p).stat().st_size > 0 for p in plots)
    else:
        assert "matplotlib is not installed" in first.stdout and not any((out / p).exists() for p in plots)

    res = json.loads((out / "results.json").read_text())
    rope, learned = res["schemes"]["rope"]["shared"], res["schemes"]["learned"]["shared"]
    assert res["lengths"] == [16, 32, 64]
    # learned positions: a number up to L0, N/A past it, and no loss-by-position curve for the 64-token windows
    assert learned["loss_by_length"]["none"]["32"]["mean"] > 0 and learned["loss_by_length"]["none"]["64"] is None
    assert learned["loss_by_position"] == {}
    assert set(rope["loss_by_length"]) == {"none", "linear", "ntk", "yarn"}
    assert set(rope["loss_by_length"]["yarn"]) == {"64"}  # scalings only beyond L0
    assert len(rope["loss_by_position"]["none"]) == 64
    # retrieval over depth x length, N/A past learned positions' reach; the first seed's look inside
    assert set(rope["retrieval"]["64"]) == {"0.0", "1.0"} and learned["retrieval"]["64"] is None
    assert len(rope["attention"]["distance"]) == 2 and learned["biases"] is None
    # the paired test uses both seeds; one shared rate: the tuned ranking is the shared one
    (claim,) = res["verdicts"]["shared"]
    assert claim["scheme"] == "learned" and claim["test"]["n"] == 2
    assert res["schemes"]["learned"]["best_scale"] == 1 and res["schemes"]["rope"]["sample"].startswith("ROMEO:")

    md = (out / "results.md").read_text()
    learned_row = next(line for line in md.splitlines() if line.startswith("| learned | none |"))
    assert learned_row.split("|")[-2].strip() == "N/A" and learned_row.split("|")[-3].strip() != "N/A"
    assert "## Ranking: every scheme at the shared learning rate" in md and "## Retrieval by length" in md
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["loss_64"] == "" for r in rows if r["scheme"] == "learned")
    assert all(float(r["loss_64_yarn"]) > 0 for r in rows if r["scheme"] == "rope")

    stamps = {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs}
    code, again, _ = ablate_main(capsys, *args[1:])
    assert code == 0 and "4 finished, 0 to resume, 0 to train" in again
    assert {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs} == stamps
    assert json.loads((out / "results.json").read_text())["schemes"] == res["schemes"]

    # changed settings are refused, naming the difference, and nothing is touched
    code, _, err = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=6")
    assert code == 1 and err.startswith("error: ") and "max_iters: 4 there, 6 now" in err and "Traceback" not in err
    assert {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs} == stamps


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(data_dir, tmp_path, capsys, monkeypatch):
    one = [*GRID, "--schemes=rope", "--seeds=1", "--max_iters=6", "--sample_tokens=0", f"--data_dir={data_dir}"]
    assert ablate_main(capsys, *one, f"--out_dir={tmp_path / 'straight'}")[0] == 0

    real_lr_at = train.lr_at

    def ctrl_c_at_step_2(it, tc):  # a real SIGINT, handled by train's own stop flag
        if it == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr_at(it, tc)

    monkeypatch.setattr(train, "lr_at", ctrl_c_at_step_2)
    code, _, err = ablate_main(capsys, *one, f"--out_dir={tmp_path / 'cut'}")
    assert code == 130 and "stopped at iteration 3 of 6" in err and "rerun the same command" in err
    assert not (tmp_path / "cut" / "runs" / "rope-seed1337" / "summary.json").exists()
    monkeypatch.undo()

    code, out, _ = ablate_main(capsys, *one, f"--out_dir={tmp_path / 'cut'}")
    assert code == 0 and "0 finished, 1 to resume, 0 to train" in out
    log = (tmp_path / "cut" / "runs" / "rope-seed1337" / "train.log").read_text()
    assert "resuming from" in log and "at iteration 3" in log
    straight, cut = (json.loads((tmp_path / d / "results.json").read_text())["schemes"]["rope"]
                     for d in ("straight", "cut"))
    for key in ("final_val_loss", "val_bpb", "val_curve", "loss_by_length", "loss_by_position"):
        assert cut["shared"][key] == straight["shared"][key], key


def test_dry_run_prints_the_grid_and_an_estimate_and_trains_nothing(data_dir, tmp_path, capsys):
    code, out, _ = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={tmp_path}",
                               "--variants=b500: rope_base=500", "--dry_run=true")
    assert code == 0 and "3 schemes x 2 seeds, 1 learning-rate scale(s): 6 runs" in out
    assert "0 finished, 0 to resume, 6 to train" in out
    assert "rope_base=500.0" in out and "estimated time:" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("arg, named", [
    ("--schemes=rope,zpos", "'zpos'"), ("--variants=b: rope_bse=5", "rope_bse"),
    ("--variants=d: drop_rope_at=5000", "scheme 'd': drop_rope_at=5000 must come before max_iters"),
    ("--variants=b: rope_fraction=0.1", "'b': "), ("--schemes=rope,rope", "repeated: rope"), ("--eval_lengths=1,abc", "abc"), ("--rope_scalings=ntk,nope", "'nope'"),
    ("--eval_lengths=8000", "does not fit"), ("--sample_prompt=ROMEO€", "€"), ("--seeds=0", "seeds=0"),
    ("--lr_scales=0.5,2", "must include 1"), ("--probe_lengths=0.25", "a window of 8 tokens cannot hold 2 needles")])
def test_bad_settings_give_one_line_errors(data_dir, tmp_path, capsys, arg, named):
    code, _, err = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", arg)
    assert code == 1 and err.startswith("error: ") and named in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_an_ablation_out_dir_in_use_is_refused_and_so_is_a_run_folder_in_training(data_dir, tmp_path, capsys):
    out = tmp_path / "abl"
    args = [*GRID, f"--data_dir={data_dir}", f"--out_dir={out}"]
    with files.RunLock(out, "ablation"):  # as a second ablate.py command would find it
        code, _, err = ablate_main(capsys, *args)
    assert code == 1 and err.count("\n") == 1 and f"error: {out} is in use by another ablation" in err
    with files.RunLock(out / "runs" / "rope-seed1337", "training run"):
        code, _, err = ablate_main(capsys, *args)
    assert code == 1 and err.count("\n") == 1 and "rope-seed1337 is in use by another training run" in err


def test_each_scheme_sweeps_its_learning_rate_on_the_first_seed_and_ranks_at_its_best(data_dir, tmp_path, capsys):
    out = tmp_path / "abl"
    code, said, _ = ablate_main(capsys, *GRID, "--schemes=rope", "--variants=d: drop_rope_at=2", "--seeds=2",
                                "--lr_scales=0.25,1", "--sample_tokens=0", "--learning_rate=0.004",
                                f"--data_dir={data_dir}", f"--out_dir={out}")
    schemes = json.loads((out / "results.json").read_text())["schemes"]
    res = schemes["rope"]
    assert code == 0 and set(res["sweep"]) == {"0.25", "1"}
    assert set(schemes["d"]["sweep"]) == {"1"} and "| d | — |" in (out / "results.md").read_text()  # DroPE: shared
    best = res["best_scale"]
    assert res["sweep"][f"{best:g}"] == min(res["sweep"].values()) and res["tuned"]["scale"] == best
    assert res["tuned"]["seeds"] == [1337, 1338] and res["shared"]["seeds"] == [1337, 1338]
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert "rope-lr0.25-seed1337" in runs and ("rope-lr0.25-seed1338" in runs) == (best == 0.25)
    lr = json.loads((out / "runs" / "rope-lr0.25-seed1337" / "config.json").read_text())["train"]["learning_rate"]
    assert lr == pytest.approx(0.001)


def test_a_variants_training_change_goes_to_its_runs_not_its_model():  # DroPE's drop
    ac = ablate.AblateConfig(schemes="rope", variants="p: rope_p=0.75; drope: drop_rope_at=800")
    grid, train_changes = ablate.make_grid(ac, GPTConfig())
    assert grid["p"].rope_p == 0.75 and grid["drope"] == GPTConfig(pos_emb="rope")
    assert train_changes == {"rope": {}, "p": {}, "drope": {"drop_rope_at": 800}}


def test_an_unsettled_comparison_brings_more_seeds_to_both_schemes(data_dir, tmp_path, capsys, monkeypatch):
    calls = iter([True, True])  # the first table's two rankings flag learned, the next do not

    def verdicts(claims):
        ask = next(calls, False)
        return [dict(c, test={"mean": 0, "ci": None, "p": None, "n": len(c["diffs"])}, p_holm=None,
                     equivalence_p=None, equivalence_p_holm=None, verdict="inconclusive", more_seeds=ask)
                for c in claims]
    monkeypatch.setattr(ablate_report, "verdicts", verdicts)
    args = [a for a in GRID if not a.startswith("--more_seeds")]
    code, said, _ = ablate_main(capsys, *args, "--more_seeds=1", "--sample_tokens=0", f"--data_dir={data_dir}",
                                f"--out_dir={tmp_path}")
    res = json.loads((tmp_path / "results.json").read_text())["schemes"]
    assert code == 0 and "seeds 1339 for them" in said
    assert res["learned"]["shared"]["seeds"] == res["rope"]["shared"]["seeds"] == [1337, 1338, 1339]


def test_drope_variants_keep_the_shared_rate_while_the_other_schemes_sweep():
    ac = ablate.AblateConfig(schemes="rope", variants="drope: drop_rope_at=800, recalibration_lr=1e-3")
    grid, train_changes = ablate.make_grid(ac, GPTConfig())
    plan = SimpleNamespace(grid=grid, train_changes=train_changes, scales=[0.5, 1, 2], seeds=[1, 2, 3])
    plan.scales_of = lambda name: ablate.Plan.scales_of(plan, name)
    assert ablate.first_arms(plan) == {("rope", 0.5): [1], ("rope", 1): [1, 2, 3], ("rope", 2): [1],
                                       ("drope", 1): [1, 2, 3]}
