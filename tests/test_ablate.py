"""lab/ablate.py: the grid end to end (every output, skip on rerun, resume after Ctrl-C, N/A past L0)."""

import csv
import importlib.util
import json
import os
import shutil
import signal
from dataclasses import replace

import numpy as np
import pytest

import files
import schemes
import train
from checkpoint import load_checkpoint, model_from_checkpoint
from conftest import TINY, run, same_tensors, untimed
from lab import ablate, ablate_report
from lab.sweep import MORE_RATES
from model import GPTConfig

# 2 schemes x 2 seeds of a tiny model, a few steps; L0 = 32, scored at 16, 32 and 64 tokens
GRID = [
    *TINY,
    "--schemes=rope,learned",
    "--seeds=2",
    "--max_iters=4",
    "--eval_interval=2",
    "--log_interval=2",
    "--eval_lengths=0.5,1,2",
    "--eval_tokens=128",
    "--sample_tokens=8",
    "--task=recall",
    "--recall_share=0.5",
    "--recall_pairs=2",
    "--probe_pairs=2",
    "--probe_lengths=1,2",
    "--probe_slots=8",
    "--probe_trials=2",
]


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


@pytest.mark.slow
def test_grid_writes_every_output_and_a_rerun_skips_finished_runs(data_dir, tmp_path, capsys):
    out = tmp_path / "abl"
    args = ["-m", "lab.ablate", *GRID, f"--data_dir={data_dir}", f"--out_dir={out}"]
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
    # retrieval by distance at L0 and 2 L0, N/A past learned positions' reach
    assert learned["retrieval"]["grid"]["64"] is None and learned["per_seed"][0]["windows"]["64"] is None
    assert (rope["retrieval"]["longest"], learned["retrieval"]["longest"]) == ("64", "32")
    assert set(rope["retrieval"]["reach"]) == {"pi", "strict"} and 0 <= rope["retrieval"]["worst_slot"]["mean"] <= 1
    # per seed: each cell's trials and hits, from which its bands are recomputed
    for seed in rope["per_seed"]:
        window = seed["windows"]["64"]
        # cells of 8 distances (the smallest divisor of L0 = 32 at least 3 pairs) tile the window
        assert list(window["cells"]) == [str(k) for k in range(8, 65, 8)]
        assert all(c["trials"] > 0 for c in window["cells"].values())
        past = [c for k, c in window["cells"].items() if int(k) > 32]  # s = 1: the longest window is 2s L0
        assert window["bands"]["sL0 to 2sL0"]["hits"] == sum(c["hits"] for c in past)
        assert window["bands"]["sL0 to 2sL0"]["trials"] == sum(c["trials"] for c in past)
    assert rope["retrieval"]["grid"]["64"].keys() == rope["per_seed"][0]["windows"]["64"]["cells"].keys()
    # steps-to-learn read at every evaluation (steps 2 and 4), censored at the ceiling where never reached
    assert [set(f["slots"]) for f in rope["per_seed"]] == [{"2", "4"}] * 2
    for f in rope["per_seed"]:
        learned_at = [int(st) for st in sorted(f["slots"], key=int) if min(f["slots"][st].values()) >= 0.9]
        assert f["learning"] == (
            {"step": learned_at[0], "learned": True} if learned_at else {"step": 4, "learned": False}
        )
    assert res["probe"]["per"] == 4 and set(res["probe"]["error_rates"]) == {"pi", "strict"}
    # every scheme's effective length is read at the gate of steps-to-learn (its default), fixed before the run
    assert res["probe"]["reference"] == 0.9
    assert all(w["effective_length"]["reference"] == 0.9 for f in rope["per_seed"] for w in f["windows"].values())
    assert len(res["learning_order"]["shared"]) == 1
    assert len(rope["attention"]["distance"]) == 2 and learned["biases"] is None
    assert rope["threads"] == [1] and res["selection_seeds"] is None  # one shared rate: no selection runs
    # one shared rate: no ranking at each scheme's own, kept once (the same runs), and the report reads it from there
    assert set(res["verdicts"]) == set(res["learning_order"]) == set(res["retrieval_past_L0"]) == {"shared"}
    # past L0 against RoPE as trained and under YaRN, read zero-shot in the windows past L0 alone
    assert [c["id"] for c in res["retrieval_past_L0"]["shared"]] == [
        "learned-retrieves-past-L0-vs-rope",
        "learned-retrieves-past-L0-vs-rope-yarn",
    ]
    assert [list(f["deployed"]) for f in rope["per_seed"]] == [["64"]] * 2 and learned["per_seed"][0][
        "deployed"
    ] is None
    assert all("tuned" not in x for x in res["schemes"].values())
    # the paired test uses both seeds
    (claim,) = res["verdicts"]["shared"]
    assert claim["scheme"] == "learned" and claim["test"]["n"] == 2
    # an equivalence test only where it can pass: at these 2 seeds it cannot, so the family is the difference test alone
    assert (claim["family"], claim["equivalence"]) == (1, False)
    assert res["schemes"]["learned"]["best_scale"] == 1 and res["schemes"]["rope"]["sample"].startswith("ROMEO:")

    md = (out / "results.md").read_text()
    learned_row = next(line for line in md.splitlines() if line.startswith("| learned | none |"))
    assert learned_row.split("|")[-2].strip() == "N/A" and learned_row.split("|")[-3].strip() != "N/A"
    assert "## Ranking: every scheme at the shared learning rate" in md and "## Retrieval by distance" in md
    assert f"one family of {claim['family']} tests" in md and "## The regime" in md
    assert "## Learning retrieval: steps to learn" in md and "2 x 0.5^2 = 0.5" in md
    assert "every scheme at the shared rate" in md and "own rate" not in md  # no sweep chose a rate
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["loss_64"] == "" for r in rows if r["scheme"] == "learned")
    assert all(float(r["loss_64_yarn"]) > 0 for r in rows if r["scheme"] == "rope")

    stamps = {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs}
    code, again, _ = ablate_main(capsys, *args[2:])
    assert code == 0 and "4 finished, 0 to resume, 0 to train" in again
    assert {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs} == stamps
    assert json.loads((out / "results.json").read_text())["schemes"] == res["schemes"]

    # changed settings are refused, naming the difference, and nothing is touched (a run grows by stages: its
    # length is recorded as the length its rate decays over)
    code, _, err = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=6")
    assert code == 1 and err.startswith("error: ") and "lr_decay_iters: 4 there, 6 now" in err
    assert "Traceback" not in err
    code, _, err = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={out}", "--recall_fewest=1")
    assert code == 1 and "recall_fewest: None there, 1 now" in err
    assert {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs} == stamps
    # other probe settings: the models the slot probe scored before the last step are gone, so the rerun is refused,
    # naming them; the final model's evaluation, at other lengths, is made again
    code, _, err = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={out}", "--probe_trials=3")
    assert code == 1 and "slots2.json was made with other settings (probe_trials: 2 there, 3 now) and cannot" in err
    code, _, _ = ablate_main(capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={out}", "--eval_lengths=1,2")
    assert code == 0 and json.loads((out / "results.json").read_text())["lengths"] == [32, 64]
    assert {r: (out / "runs" / r / "ckpt.pt").stat().st_mtime_ns for r in runs} == stamps


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(data_dir, tmp_path, capsys, monkeypatch):
    one = [*GRID, "--schemes=rope", "--seeds=1", "--max_iters=6", "--sample_tokens=0", f"--data_dir={data_dir}"]
    assert ablate_main(capsys, *one, f"--out_dir={tmp_path / 'straight'}")[0] == 0

    real_lr = train.Schedule.lr

    def ctrl_c_at_step_2(self, it):  # a real SIGINT, handled by train's own stop flag
        if it == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr(self, it)

    monkeypatch.setattr(train.Schedule, "lr", ctrl_c_at_step_2)
    code, _, err = ablate_main(capsys, *one, f"--out_dir={tmp_path / 'cut'}")
    assert code == 130 and "stopped at iteration 3 of 6" in err and "rerun the same command" in err
    assert not (tmp_path / "cut" / "runs" / "rope-seed1337" / "summary.json").exists()
    monkeypatch.undo()

    code, out, _ = ablate_main(capsys, *one, f"--out_dir={tmp_path / 'cut'}")
    assert code == 0 and "0 finished, 1 to resume, 0 to train" in out
    log = (tmp_path / "cut" / "runs" / "rope-seed1337" / "train.log").read_text()
    assert "resuming from" in log and "at iteration 3" in log
    straight, cut = (
        json.loads((tmp_path / d / "results.json").read_text())["schemes"]["rope"] for d in ("straight", "cut")
    )
    for key in ("final_val_loss", "val_bpb", "val_curve", "loss_by_length", "loss_by_position", "per_seed"):
        assert cut["shared"][key] == straight["shared"][key], key


def test_steps_to_learn_is_the_first_evaluation_with_every_slot_at_the_gate_else_the_ceiling_censored():
    slots = {"100": {"1": 0.95, "2": 0.5}, "200": {"1": 0.9, "2": 0.92}, "300": {"1": 1.0, "2": 1.0}}
    assert ablate_report.steps_to_learn(slots, 0.9) == {"step": 200, "learned": True}
    assert ablate_report.steps_to_learn(slots, 0.99) == {"step": 300, "learned": True}
    assert ablate_report.steps_to_learn({k: {"1": 0.1} for k in slots}, 0.9) == {"step": 300, "learned": False}


def learning(steps, learned):
    return {"shared": {"seeds": list(range(len(steps))), "learning": {"steps": steps, "learned": learned}}}


def test_the_sign_test_of_who_learns_first_drops_ties_counts_a_lone_learner_first_and_holm_decides():
    ceiling, n = 1000, 8
    schemes = {
        "rope": learning([500] * n, [True] * n),
        "fast": learning([200] * n, [True] * n),  # first on every seed
        "never": learning([ceiling] * n, [False] * n),  # after on every seed: the reference alone learned
        "same": learning([500] * n, [True] * n),
    }  # every seed a tie: no test
    order = {c["scheme"]: c for c in ablate_report.learning_order(schemes, "rope", "shared")}
    assert (order["fast"]["earlier"], order["fast"]["later"], order["fast"]["ties"]) == (8, 0, 0)
    assert order["fast"]["p"] == pytest.approx(2 * 0.5**8) and order["fast"]["verdict"] == "earlier"
    assert order["never"]["later"] == 8 and order["never"]["verdict"] == "later"
    assert order["same"]["p"] is None and order["same"]["verdict"] is None and order["same"]["ties"] == 8
    assert {c["family"] for c in order.values()} == {2} and order["fast"]["p_holm"] == pytest.approx(4 * 0.5**8)
    assert order["fast"]["can_settle"]
    # both censored is a tie; one censored: the other learned first; too few untied seeds cannot settle anything
    schemes = {
        "rope": learning([ceiling, ceiling, 300, 400, 500], [False, False, True, True, True]),
        "x": learning([ceiling, 900, ceiling, 100, 200], [False, True, False, True, True]),
    }
    (c,) = ablate_report.learning_order(schemes, "rope", "shared")
    assert (c["earlier"], c["later"], c["ties"]) == (3, 1, 1) and c["smallest_p"] == pytest.approx(2 * 0.5**4)
    assert c["p"] == pytest.approx(0.625) and not c["can_settle"] and c["verdict"] == "inconclusive"


def test_dry_run_prints_the_grid_and_an_estimate_and_trains_nothing(data_dir, tmp_path, capsys):
    code, out, _ = ablate_main(
        capsys,
        *GRID,
        f"--data_dir={data_dir}",
        f"--out_dir={tmp_path}",
        "--variants=b500: rope_base=500",
        "--dry_run=true",
    )
    assert (
        code == 0 and "3 schemes x 2 test seeds: 6 runs" in out and "dry run, launch 1: 6 runs here, 1 at a time" in out
    )
    assert "0 finished, 0 to resume, 6 to train" in out
    assert "rope_base=500.0" in out and "estimated time:" in out
    assert not (tmp_path / "runs").exists()


def test_a_slurm_dry_run_lists_every_launch_and_the_hours_it_requests(data_dir, tmp_path, capsys):
    slurm = ["--launcher=slurm", "--slurm_gpus=1", "--slurm_cpus=2", "--slurm_time=60", f"--slurm_folder={tmp_path}/l"]
    code, out, _ = ablate_main(
        capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--lr_scales=0.5,1,2", "--dry_run", *slurm
    )
    lines = out.splitlines()
    # 2 schemes x 3 rates x 2 selection seeds, then 2 x 2 test seeds
    at = lines.index("launch 1: 16 jobs (0 of the 16 runs finished already)")
    assert code == 0 and lines[at + 1].startswith(
        "  array 1, submitted at once, 16 jobs: rope-lr0.5 seed 1000, rope-lr0.5 seed 1001, "
    )
    assert lines[at + 2].startswith(
        "then at most 8 jobs, as each arm's sweep finishes: up to 2 more rates on selection seeds 1000, 1001 "
    )
    assert lines[at + 3].startswith("then at most 4 jobs, as each arm's sweep chooses its rate: test seeds 1337, 1338")
    assert lines[at + 4].startswith("in all at most 28 jobs of 60 min: 28 GPU-hours and 56 CPU-hours requested")
    assert len(lines) == at + 5 and not (tmp_path / "runs").exists() and not (tmp_path / "l").exists()


@pytest.mark.parametrize(
    "arg, named",
    [
        ("--schemes=rope,zpos", "'zpos'"),
        ("--variants=b: rope_bse=5", "rope_bse"),
        ("--variants=d: drop_rope_at=5000", "scheme 'd': drop_rope_at=5000 must lie between 0 and max_iters=4"),
        ("--variants=d: recalibration_lr=1e-3", "variant 'd': DroPE's recalibration_lr needs drop_rope_at"),
        ("--variants=b: rope_fraction=0.1", "'b': "),
        ("--schemes=rope,rope", "repeated: rope"),
        ("--eval_lengths=1,abc", "abc"),
        ("--rope_scalings=ntk,nope", "'nope'"),
        ("--eval_lengths=8000", "does not fit"),
        ("--sample_prompt=ROMEO€", "€"),
        ("--seeds=0", "seeds=0"),
        ("--lr_scales=0.5,2", "must include 1"),
        ("--probe_lengths=0.125", "a probe window of W=4 tokens cannot hold a block of 2"),
        (("--lr_scales=1,2", "--selection_seed=1336"), "seeds 1337 are also test seeds [1337, 1338]"),
        ("--equivalence_margin=inf", "equivalence_margin=inf must be a finite number > 0"),
        ("--lr_scales=1,inf", "lr_scales='1,inf' must list finite numbers"),
    ],
)
def test_bad_settings_give_one_line_errors(data_dir, tmp_path, capsys, arg, named):
    code, _, err = ablate_main(
        capsys, *GRID, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *(arg if isinstance(arg, tuple) else (arg,))
    )
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


@pytest.mark.slow
def test_each_scheme_sweeps_its_rate_on_the_held_out_seed_widens_an_edge_and_ranks_at_its_best(
    data_dir, tmp_path, capsys
):
    out = tmp_path / "abl"
    code, said, _ = ablate_main(
        capsys,
        *GRID,
        "--schemes=rope",
        "--variants=d: drop_rope_at=2",
        "--seeds=2",
        "--lr_scales=0.25,1",
        "--sample_tokens=0",
        "--learning_rate=0.004",
        "--workers=2",
        f"--data_dir={data_dir}",
        f"--out_dir={out}",
    )
    res = json.loads((out / "results.json").read_text())
    schemes, rope = res["schemes"], res["schemes"]["rope"]
    assert code == 0 and res["selection_seeds"] == [1000, 1001] and {"0.25", "1"} <= set(rope["sweep"])
    md = (out / "results.md").read_text()
    assert schemes["d"]["sweep"] == {} and "| d | — |" in md  # DroPE: the shared rate
    assert "each scheme at its own rate" in md and "every scheme at the shared rate" not in md
    best = rope["best_scale"]
    assert rope["sweep"][f"{best:g}"] == min(rope["sweep"].values()) and rope["tuned"]["scale"] == best
    scales = sorted(map(float, rope["sweep"]))
    assert len(scales) == 2 or scales[0] < best < scales[-1] or len(scales) == 2 + MORE_RATES  # widened
    assert rope["tuned"]["seeds"] == rope["shared"]["seeds"] == [1337, 1338]  # the selection seed tests nothing
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert all(
        name.endswith(("seed1000", "seed1001"))
        for name in runs
        if "-lr" in name and name not in (f"rope-lr{best:g}-seed1337", f"rope-lr{best:g}-seed1338")
    )
    # the best by the loss averaged over the two selection seeds, each seed's kept beside it as its run wrote it
    by_seed = rope["sweep_by_seed"]
    assert set(by_seed) == {"1000", "1001"} and by_seed["1000"].keys() == rope["sweep"].keys()
    for k, mean in rope["sweep"].items():
        assert mean == pytest.approx((by_seed["1000"][k] + by_seed["1001"][k]) / 2)
    summary = json.loads((out / "runs" / "rope-lr0.25-seed1001" / "summary.json").read_text())
    assert by_seed["1001"]["0.25"] == summary["final_val_loss"] and "each seed's best" in md
    lr = json.loads((out / "runs" / "rope-lr0.25-seed1000" / "config.json").read_text())["train"]["learning_rate"]
    assert lr == pytest.approx(0.001)
    summary = json.loads((out / "runs" / "rope-seed1337" / "summary.json").read_text())
    assert summary["threads"] == 1  # two runs at a time on 2 threads: one each, recorded beside tokens/s


def test_a_variants_training_change_goes_to_its_schedule_not_its_model():  # DroPE's drop
    ablate_cfg = ablate.AblateConfig(schemes="rope", variants="p: rope_p=0.75; drope: drop_rope_at=800")
    grid, drops = ablate.make_grid(ablate_cfg, GPTConfig())
    assert grid["p"].rope_p == 0.75 and grid["drope"] == GPTConfig(pos_emb="rope")
    assert drops == {"rope": None, "p": None, "drope": ablate.DroPE(drop_rope_at=800)}


def test_drope_drops_rope_mid_run_and_resumes_after_the_drop_exactly(data_dir, tmp_path, capsys):
    model_cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)
    train_cfg = train.TrainConfig(
        data_dir=str(data_dir),
        batch_size=4,
        eval_iters=2,
        progress=False,
        compile=False,
        dtype="float32",
        max_iters=6,
        lr_decay_iters=6,
        eval_interval=2,
        log_interval=1,
    )
    schedule = ablate.DropSchedule(train_cfg, ablate.DroPE(drop_rope_at=3))
    straight, split = tmp_path / "straight", tmp_path / "split"
    train.train(model_cfg, replace(train_cfg, out_dir=str(straight)), schedule=schedule)
    assert "iteration 3: the schedule changes the model's pos_emb 'rope' -> 'none'" in capsys.readouterr().out
    ckpt = load_checkpoint(straight / "ckpt.pt")
    assert ckpt["model_config"]["pos_emb"] == "none"  # the checkpoint after the drop has no rotation
    assert type(model_from_checkpoint(ckpt).scheme) is schemes.NoPE
    assert json.loads((straight / "config.json").read_text())["schedule"] == {
        "drop_rope_at": 3,
        "recalibration_lr": None,
        "recalibration_warmup": 20,
    }
    train.train(
        model_cfg, replace(train_cfg, out_dir=str(split), max_iters=4), schedule=schedule
    )  # stops after the drop
    train.train(
        model_cfg, replace(train_cfg, out_dir=str(split), resume=True), schedule=schedule
    )  # resumed past the drop
    a, b = load_checkpoint(straight / "ckpt.pt"), load_checkpoint(split / "ckpt.pt")
    assert same_tensors(a["model"], b["model"]) and same_tensors(a["optimizer"], b["optimizer"])
    logs = [
        [json.loads(line)["train_loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (straight, split)
    ]
    assert logs[0] == logs[1]


def test_drope_recalibrates_on_a_schedule_of_its_own_when_given_a_peak():
    train_cfg = train.TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=2, max_iters=20)
    lrs = [ablate.DropSchedule(train_cfg, ablate.DroPE(10, 0.5, 3)).lr(it) for it in range(20)]
    assert lrs[:10] == [train.Schedule(train_cfg).lr(it) for it in range(10)]  # before the drop: the run's own schedule
    assert lrs[10:13] == pytest.approx([0.125, 0.25, 0.375]) and lrs[13] == pytest.approx(0.5)  # re-warmed to 0.5
    assert lrs[19] == pytest.approx(0.05 + 0.5 * (1 + np.cos(np.pi * 6 / 7)) * 0.45)  # cosine to a tenth of it
    assert [ablate.DropSchedule(train_cfg, ablate.DroPE(10)).lr(it) for it in range(20)] == [
        train.Schedule(train_cfg).lr(it) for it in range(20)
    ]  # without a peak of its own: the run's schedule goes on


QUICK_SHRUNK = [
    "configs/ablate_quick_cpu.toml",
    *TINY,
    "--workers=1",
    "--max_iters=2",
    "--eval_interval=2",
    "--eval_tokens=128",
    "--probe_slots=4",
    "--recall_pairs=2",
    "--recall_fewest=1",
    "--probe_pairs=2",
    "--sample_tokens=4",
]


@pytest.mark.slow
def test_a_grid_run_in_parts_on_machines_that_share_nothing_reports_as_one_run(data_dir, tmp_path, capsys):
    """Three test seeds dealt to two parts, each in a folder of its own, keeping compact records (no checkpoint):
    their runs merged into one folder give the report a one-machine run gives, timings aside."""
    grid = [*QUICK_SHRUNK, "--seeds=3", f"--data_dir={data_dir}"]
    code, out, _ = ablate_main(capsys, *grid, "--parts=2", "--dry_run=true", f"--out_dir={tmp_path / 'dry'}")
    assert code == 0 and "part 1 of 2 (--part=1): test seeds 1337, 1339, 4 runs" in out
    assert "part 2 of 2 (--part=2): test seeds 1338, 2 runs" in out
    code, _, err = ablate_main(capsys, *grid, f"--out_dir={tmp_path / 'one'}")
    assert code == 0, err
    merged = tmp_path / "merged" / "runs"
    for part in (1, 2):
        folder = tmp_path / f"part{part}"
        code, out, err = ablate_main(
            capsys, *grid, "--parts=2", f"--part={part}", "--keep_checkpoints=false", f"--out_dir={folder}"
        )
        assert code == 0 and f"part {part} of 2 done" in out, err
        assert not (folder / "results.json").exists() and not list(folder.rglob("*.pt"))
        shutil.copytree(folder / "runs", merged, dirs_exist_ok=True)  # what a user carries from each machine
    assert sorted(p.name for p in merged.iterdir()) == sorted(p.name for p in (tmp_path / "one" / "runs").iterdir())
    code, _, err = ablate_main(capsys, *grid, f"--out_dir={merged.parent}")
    assert code == 0, err
    one, both = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "merged"))
    assert untimed(both) == untimed(one)


@pytest.mark.slow
def test_the_quick_config_runs_shrunk_and_its_results_open_with_every_verdict(data_dir, tmp_path, capsys):
    """configs/ablate_quick_cpu.toml's own schemes and settings, on a tiny model, few steps and two seeds: results.md
    opens with the verdicts of its four claims, loss at L0 and past it, learning order and retrieval past L0."""
    out = tmp_path / "abl"
    code, _, err = ablate_main(capsys, *QUICK_SHRUNK, "--seeds=2", f"--data_dir={data_dir}", f"--out_dir={out}")
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert list(res["schemes"]) == ["rope", "sinusoidal"] and res["settings"]["ablate"]["rope_scalings"] == "yarn"
    title, verdicts, setup = (out / "results.md").read_text().split("\n\n## ")[:3]
    assert title == "# Positional-scheme ablation" and verdicts.startswith("Verdicts") and setup.startswith("Setup")
    for claim in ("loss-vs-rope", "loss-past-L0-vs-rope-yarn", "learns-first-vs-rope", "retrieves-past-L0-vs-rope"):
        assert f"`sinusoidal-{claim}`" in verdicts, claim


@pytest.mark.slow
def test_the_gpu_config_runs_shrunk_on_the_cpu(data_dir, tmp_path, capsys):
    """configs/ablate_gpu.toml's own settings, with a tiny model, few steps and float32 on the CPU."""
    out = tmp_path / "abl"
    code, _, err = ablate_main(
        capsys,
        "configs/ablate_gpu.toml",
        *TINY,
        "--schemes=rope,learned",
        "--seeds=2",
        "--max_iters=2",
        "--eval_interval=2",
        "--eval_tokens=128",
        "--probe_trials=2",
        "--probe_slots=4",
        "--recall_pairs=2",
        "--recall_fewest=1",
        "--probe_pairs=2",
        "--sample_tokens=4",
        "--device=cpu",
        f"--data_dir={data_dir}",
        f"--out_dir={out}",
    )
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert set(res["schemes"]) == {"rope", "learned"} and res["lengths"] == [32, 64]
