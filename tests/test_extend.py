"""lab/extend.py: base models held at a constant rate until they pass the gate, then decayed; the first seeds
whose base passes, screened in order, enter; rates swept on a held-out seed; every arm fine-tuned to the same steps
in stages that add up to one run and read there; each seed's probe counts; the claims with their verdicts over one
stated Holm family; resume by rerun."""

import json
import re
import shutil
import statistics

import pytest

import train
from checkpoint import load_checkpoint
from conftest import ROOT, TINY, run, same_tensors, untimed
from lab import extend, extend_report, sweep

# L0 = 32: RoPE (base 200), every base passing the gate (0) at its first probe (step 2) and decayed 2 steps; 2 test
# seeds and the selection seed; each method fine-tuned 4 steps at 64 tokens, scored at steps 0, 2 and 4
LAB = [
    *TINY,
    "--rope_bases=200",
    "--seeds=2",
    "--methods=none,linear,pose",
    "--factors=2",
    "--base_check=2",
    "--base_gate=0",
    "--base_decay=2",
    "--max_iters=4",
    "--warmup_iters=1",
    "--eval_interval=2",
    "--log_interval=1",
    "--finetune_lrs=3e-3",
    "--finetune_eval=2",
    "--plateau_span=2",
    "--finetune_steps=2,4",
    "--eval_tokens=128",
    "--probe_trials=2",
    "--probe_slots=8",
    "--probe_pool=2",
    "--task=recall",
    "--recall_share=0.5",
    "--recall_pairs=2",
    "--probe_pairs=2",
]


@pytest.mark.slow
def test_the_lab_reads_every_arm_at_equal_steps_keeps_each_seeds_cells_and_a_rerun_trains_nothing(
    data_dir, tmp_path, capsys
):
    out = tmp_path / "ext"
    args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={out}"]
    run("-m", "lab.extend", *args, "--workers=2")  # two runs at a time, each in a process of its own
    res = json.loads((out / "results.json").read_text())
    tests = sorted(p.name for p in (out / "finetune").iterdir())
    # one rate for every arm: no sweep, and no selection seed screened
    assert not (out / "sweep").exists() and res["selection_seeds"] is None
    assert res["screening"]["selection"] == {"screened": [], "passed": [], "included": []}
    assert {name.rsplit("-seed", 1)[1] for name in tests} == {"1337", "1338"}
    assert res["screening"]["test"] == {"screened": [1337, 1338], "passed": [1337, 1338], "included": [1337, 1338]}
    for arm in res["finetune"].values():
        assert set(arm["runs"]) == {"1337", "1338"} and arm["lr"] == 3e-3 and arm["sweep"] == {}
        for run0 in arm["runs"].values():  # every arm, every seed: scored at the same steps, trained to the last
            assert set(run0["scores"]) == {"0", "2", "4"} and max(map(int, run0["l0_curve"])) == 4
            for st, sc in run0["scores"].items():  # each cell's trials and hits
                cells = sc["retrieval"]["target"]["cells"]
                assert cells and all(set(c) == {"trials", "hits", "blind"} and c["trials"] > 0 for c in cells.values())
                assert max(map(int, cells)) == 64  # the cells tile the window of s L0
                # what context past L0 is worth, at the read step: the same tokens read from L0 and from s L0
                assert ("context" in sc) == (st == "4")
                # past the fine-tuned length at the read step, which the claims read
                assert ("past" in sc["retrieval"]) == (st == "4")
            assert max(map(int, run0["scores"]["4"]["retrieval"]["past"]["cells"])) > 64
    for folder in (out / "base").iterdir():  # the base models learn the recall task
        assert json.loads((folder / "config.json").read_text())["batches"]["task"] == "recall"
    for name in tests:  # the scaling and L0 are the run's own, saved where sampling, evaluation and resume read them
        # PI's protocol: the fine-tunes see text alone, and retrieval past L0 is read zero-shot
        assert json.loads((out / "finetune" / name / "config.json").read_text())["batches"]["task"] == "text"
        ckpt = load_checkpoint(out / "finetune" / name / "ckpt.pt")
        cfg, method = ckpt["model_config"], name.split("-")[2]
        assert (cfg["original_len"], cfg["rope_base"]) == (32, 200.0) and cfg["block_size"] == (
            32 if method == "pose" else 64
        )
        assert ckpt["iter"] == 4
    pi = res["finetune"]["rope-b200-linear-x2"]
    assert set(pi["by_step"]) == {"0", "2", "4"} and set(pi["by_step"]["4"]["loss"]) == {"32", "64", "128"}
    assert set(pi["by_step"]["4"]["bands"]) == set(extend_report.BANDS)
    assert [int(st) for st in pi["runs"]["1337"]["l0_curve"]] == [0, 2, 4]
    assert res["regime"][-1]["name"].startswith("LLaMA-2-7B") and res["memory"]["pose x2"] < res["memory"]["linear x2"]
    first = res["finetune"]["rope-b200-none-x2"]["runs"]["1337"]["scores"]["4"]["retrieval"]["target"]["cells"]
    assert res["error_rates"]["64"]["trials"] == sum(c["trials"] for c in list(first.values())[:2])  # 2 cells a pool
    md = (out / "results.md").read_text()
    family = int(re.search(r"one family of (\d+) tests", md)[1])
    assert (
        family
        == res["claims"][0]["family"]
        == sum(c["verdict"] != extend_report.AT_FLOOR for c in res["claims"])  # each a paired or a beyond test
        + sum(c["equivalence_p"] is not None for c in res["claims"])  # and the equivalence tests that can pass
    )
    assert {c["verdict"] for c in res["claims"]} <= {
        "holds",
        "does not hold",
        "inconclusive",
        extend_report.UNTESTED,
        extend_report.AT_FLOOR,
    }

    # a base model's rate: warmed up, held to the gate (its first probe, step 2), then decayed; the gate recorded
    base = out / "base" / "rope-b200-seed1337"
    assert json.loads((base / "config.json").read_text())["schedule"]["decay_from"] == 2
    lrs = [m["lr"] for m in map(json.loads, (base / "metrics.jsonl").read_text().splitlines()) if "lr" in m]
    assert lrs[1] == lrs[2] > lrs[3] > lrs[0] and res["base"]["rope-b200"]["1337"]["gate"] == 2

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")}
    extend.main(args)  # in-process from here on: the command itself ran above
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")} == stamps, capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["finetune"] == res["finetune"]

    # a finished folder is reused only with the settings it records, and only whole
    code, err = extend_main(capsys, *args, "--n_embd=48")
    assert code == 1 and "n_embd: 32 there, 48 now" in err and f"{out / 'base'}" in err and err.count("\n") == 1, err
    code, err = extend_main(capsys, *args, "--base_gate=0.5")  # the gate decides a base model's schedule
    assert code == 1 and "schedule.gate: 0 there, 0.5 now" in err.replace("0.0", "0"), err
    step = out / "finetune" / "rope-b200-none-x2-lr0.003-seed1337" / "step2.json"
    intact = step.read_text()
    step.write_text(intact[:50])  # truncated: it cannot be made again, the checkpoint having moved on
    code, err = extend_main(capsys, *args)
    assert code == 1 and err.startswith(f"error: {step} cannot be read (") and f"delete {step.parent} and" in err, err
    step.write_text(intact)

    # a lab folder that moved reruns reusing everything; a fine-tune from another base model is still refused
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)  # the files' times kept
    moved_args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={moved}"]
    kept = {p.relative_to(moved): p.stat().st_mtime_ns for p in moved.rglob("*.pt")}
    extend.main(moved_args)
    assert {p.relative_to(moved): p.stat().st_mtime_ns for p in moved.rglob("*.pt")} == kept
    assert json.loads((moved / "results.json").read_text())["finetune"] == res["finetune"]
    ft = moved / "finetune" / "rope-b200-none-x2-lr0.003-seed1338" / "config.json"
    ft.write_text(ft.read_text().replace("base/rope-b200-seed1338", "base/rope-b200-seed1337"))
    code, err = extend_main(capsys, *moved_args)
    assert code == 1 and f"{ft.parent} was made with other settings (train.init_from: " in err, err

    # other probe settings: the models its cells scored at steps training has passed are gone, so the rerun is
    # refused, naming them, and changes nothing; a reading of the cached scores is made again
    code, err = extend_main(capsys, *args, "--probe_trials=3", "--probe_slots=5")
    assert code == 1 and "(probe_trials: 2 there, 3 now; probe_slots: 8 there, 5 now) and cannot" in err, err
    assert json.loads((out / "results.json").read_text())["settings"]["extend"]["probe_trials"] == 2
    extend.main([*args, "--plateau_tol=1"])  # every L0 loss fell by less than 1 over 2 steps: levelled at step 2
    levelled = json.loads((out / "results.json").read_text())["finetune"]
    assert {r["plateau"] for arm in levelled.values() for r in arm["runs"].values()} == {2}
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")} == stamps

    # the stages add up to one run: fine-tuning straight to the last step gives the same weights
    folder = out / "finetune" / "rope-b200-linear-x2-lr{:g}-seed1337".format(pi["lr"])
    ft = json.loads((folder / "config.json").read_text())
    straight = tmp_path / "straight"
    train.main(
        [
            *TINY,
            f"--data_dir={data_dir}",
            f"--out_dir={straight}",
            *(
                f"--{k}={v}"
                for k, v in {**ft["model"], **ft["train"], **ft["batches"]}.items()
                if k not in ("out_dir", "resume", "vocab_size") and v is not None
            ),
        ]
    )
    assert same_tensors(load_checkpoint(straight / "ckpt.pt")["model"], load_checkpoint(folder / "ckpt.pt")["model"])


@pytest.mark.slow
def test_seeds_whose_base_fails_the_gate_are_screened_out_in_order_and_the_ceiling_refuses(
    data_dir, tmp_path, capsys, monkeypatch
):
    """Seeds 1338 and 1000 fail the gate (their probe says no slot retrieves): the next seeds are screened in order,
    1339 and 1001 taken; screen_most=2 stops short of them."""
    probed = extend.probed

    def gated(lab, out, step):
        scores = probed(lab, out, step)
        failing = out.name.endswith(("seed1338", "seed1000"))
        return scores | {"slot": {j: 0.0 if failing else 1.0 for j in scores["slot"]}}

    monkeypatch.setattr(extend, "probed", gated)
    out = tmp_path / "ext"
    args = [
        *LAB,
        "--base_gate=0.5",
        "--methods=none,linear",
        "--finetune_lrs=1e-3,3e-3",  # rates to choose: a selection seed is screened
        "--selection_seeds=1",  # one, to keep the test short: two are tested on a stub lab below
        "--finetune_steps=2",
        f"--data_dir={data_dir}",
        f"--out_dir={out}",
    ]
    code, err = extend_main(capsys, *args, "--screen_most=2")
    assert code == 1 and err.startswith(
        "error: 1 of the 2 test seeds screened (screen_most) passed the gate (1337, 1338); 2 needed: raise screen_most"
    ), err
    assert not (out / "finetune").exists()  # refused before any method touched a base model
    extend.main(args)  # the bases screened already are reused
    res = json.loads((out / "results.json").read_text())
    assert res["screening"] == {
        "selection": {"screened": [1000, 1001], "passed": [1001], "included": [1001]},
        "test": {"screened": [1337, 1338, 1339], "passed": [1337, 1339], "included": [1337, 1339]},
    }
    assert res["seeds"] == [1337, 1339] and res["selection_seeds"] == [1001]
    assert all(set(arm["runs"]) == {"1337", "1339"} for arm in res["finetune"].values())
    failed = res["base"]["rope-b200"]["1338"]
    assert (failed["gate"], failed["passed"], failed["steps"]) == (None, False, 4)  # up to the ceiling, undecayed
    assert {p.name.rsplit("-seed", 1)[1] for p in (out / "sweep").iterdir()} == {"1001"}
    # every arm's effective length is read at the gate's share, fixed in the config, whatever the bases scored
    lengths = [
        sc["effective"] for a in res["finetune"].values() for r in a["runs"].values() for sc in r["scores"].values()
    ]
    assert res["reference"] == 0.5 and all(e["reference"] == 0.5 for e in lengths if e) and any(lengths)
    md = (out / "results.md").read_text()
    assert "| test | 1338 | rope-b200 | not by the ceiling | 4 | 0% | no | no |" in md
    assert "Inclusion depends on the base model alone, before any method touches it" in md


def test_a_base_models_rate_is_held_to_the_gate_then_decays():
    train_cfg = train.TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=2, max_iters=100)
    held = extend.GateSchedule(train_cfg, 0.9, 10, 20)
    assert [held.lr(it) for it in (0, 1, 2, 50, 99)] == [1 / 3, 2 / 3, 1.0, 1.0, 1.0]
    decayed = extend.GateSchedule(train_cfg, 0.9, 10, 20, decay_from=30)
    assert all(decayed.lr(it) == held.lr(it) for it in range(30))  # the stages before the gate are the same run's
    assert decayed.lr(30) == 1.0 > decayed.lr(40) > decayed.lr(49) > decayed.lr(50) == pytest.approx(0.1)
    assert decayed.settings()["decay_from"] == 30 and held.settings()["decay_from"] is None


def extend_main(capsys, *args):
    """extend.main in-process: (exit code, stderr)."""
    try:
        extend.main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


PART = r"(.+) whose base models pass, about ([\d.e-]+) to ([\d.e-]+) min wall here, every base model passing"
DRY = ["--dry_run", "--methods=none,pose", "--finetune_lrs=1e-3,3e-3"]  # 2 arms, each swept over 2 rates


def test_a_dry_run_prints_the_screening_and_every_launch_with_its_job_count(data_dir, tmp_path, capsys):
    extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ext'}", *DRY, "--workers=2"])
    lines = capsys.readouterr().out.splitlines()
    # the bases first (the 2 selection seeds' and 2 test seeds'), then up to 12 seeds a role in all, 4 of them listed
    assert lines[:2] == [
        "dry run, screening: 4 runs here, 2 at a time: rope-b200 seed 1000, rope-b200 seed 1001, rope-b200 seed 1337, "
        "rope-b200 seed 1338",
        "then at most 20 runs, as each base model fails the gate: the next seed's, up to 12 seeds a role",
    ]
    # 2 methods x 2 rates x 2 selection seeds once both passed, each sweep widened by 2 at most, then the test seeds
    assert lines[2].startswith(
        "dry run, launch 1: 8 runs here, 2 at a time, once the selection seeds passed the screening: rope-b200 none x2 "
        "lr 0.001 seed 1000, rope-b200 none x2 lr 0.001 seed 1001"
    )
    assert lines[3].startswith(
        "then at most 8 runs, as each arm's sweep finishes: up to 2 more rates on selection seeds 1000, 1001"
    )
    assert lines[4].startswith(
        "then at most 4 runs, as each arm's sweep chooses its rate and each test seed passes the screening: test seeds "
        "1337, 1338 of 2 arms"
    )
    assert len(lines) == 5 and not (tmp_path / "ext").exists()
    # one rate: no sweep and no selection seed; the test seeds' fine-tunes wait for their seed alone
    extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ext'}", *DRY[:2], "--finetune_lrs=1e-3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dry run, screening: 2 runs here, 1 at a time: rope-b200 seed 1337, rope-b200 seed 1338"
    assert lines[2].startswith(
        "then at most 4 runs, as each test seed passes the screening: test seeds 1337, 1338 of 2 arms"
    )
    assert len(lines) == 3 and not (tmp_path / "ext").exists()
    # in parts: each its share of the candidates and the seeds, its time from FLOPs with the selection seeds' sweeps
    extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ext'}", *DRY, "--parts=2", "--seeds=3"])
    parts = [m for line in capsys.readouterr().out.splitlines() if (m := re.match(PART, line))]
    assert [m[1] for m in parts] == [
        "part 1 of 2 (--part=1): the first 2 of seeds 1337, 1339, 1341, 1343, 1345, 1347",
        "part 2 of 2 (--part=2): the first 1 of seeds 1338, 1340, 1342, 1344, 1346, 1348",
    ]
    (one, one_most), (two, two_most) = ((float(m[2]), float(m[3])) for m in parts)
    assert 0 < two < one < one_most and two < two_most  # a seed's base models at their ceiling take longer


def test_a_slurm_dry_run_shows_every_launch_of_the_local_one_with_the_resources_and_hours_it_requests(
    data_dir, tmp_path, capsys
):
    args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ext'}", *DRY]
    extend.main(args)
    local = capsys.readouterr().out.splitlines()
    slurm = ["--launcher=slurm", "--slurm_gpus=2", "--slurm_cpus=4", "--slurm_time=30", f"--slurm_folder={tmp_path}/l"]
    extend.main([*args, *slurm])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "dry run: Slurm jobs named 'extend', each 2 GPU(s), 4 CPUs, the partition's default memory and 30 min on "
    )
    # the launches known before anything trains, with their jobs; those that results decide, at most so many
    known = {m[1]: int(m[2]) for line in local if (m := re.match(r"dry run, (.+?): (\d+) runs here", line))}
    assert known == {"screening": 4, "launch 1": 8}
    assert {m[1]: int(m[2]) for line in lines if (m := re.match(r"(\w[^:]*): (\d+) jobs \(0 of", line))} == known
    later = [line.replace(" runs, ", " jobs, ", 1) for line in local if line.startswith("then at most ")]
    assert [line for line in lines if line.startswith("then at most ")] == later and len(later) == 3
    # each marked with what it waits for: launch 1's array for the screening, the later ones for the runs before
    waits = "  array 1, submitted once the selection seeds passed the screening, 8 jobs: rope-b200 none"
    assert any(line.startswith(waits) for line in lines)
    assert all(re.match(r"then at most \d+ jobs, as each ", line) for line in later)
    # in all, every job at most, each 30 min of 2 GPUs and 4 CPUs
    jobs = sum(known.values()) + sum(int(line.split()[3]) for line in later)
    assert jobs == 4 + 20 + 8 + 8 + 4 and lines[-1].startswith(
        f"in all at most {jobs} jobs of 30 min: {jobs} GPU-hours and {jobs * 2} CPU-hours requested"
    )
    assert not (tmp_path / "ext").exists() and not (tmp_path / "l").exists()


def test_bad_lab_settings_give_one_line_errors(data_dir, tmp_path, capsys):
    for bad, named in (
        ("--methods=pi", "'pi' is unknown"),
        ("--finetune_steps=0,2", "finetune_steps='0,2'"),
        ("--factors=0.5", "factors='0.5'"),
        ("--recall_share=0", "recall_share=0"),
        ("--selection_seed=1330", "selection_seed=1330 and seed=1337: the 12 seeds screened from each"),
        ("--seeds=13", "seeds=13 must be <= screen_most=12"),
        ("--pos_emb=alibi", "fine-tunes RoPE"),
        ("--workers=0", "workers=0 must be a positive integer"),
        ("--finetune_steps=3", "multiples of finetune_eval=2"),
        ("--factors=2,inf", "factors='2,inf' must list finite numbers >= 1.0"),
        ("--finetune_lrs=nan", "finetune_lrs='nan' must list finite numbers"),
    ):
        try:
            extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", bad])
            code = 0
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and named in err and err.count("\n") == 1, err
    text_alone = [a for a in LAB if not a.startswith(("--task", "--recall_"))]
    with pytest.raises(SystemExit):
        extend.main([*text_alone, f"--data_dir={data_dir}", f"--out_dir={tmp_path}"])
    assert "task=text: the lab's retrieval probe needs the recall task in training" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_l0_loss_levels_off_where_it_fell_less_than_plateau_tol_over_plateau_span():
    extend_cfg = extend.ExtendConfig(finetune_eval=50, plateau_span=100, plateau_tol=0.01)
    assert extend.plateau({"0": 3.0, "50": 2.5, "100": 2.4}, extend_cfg) is None
    assert extend.plateau({"0": 3.0, "50": 2.5, "100": 2.495, "150": 2.491, "200": 2.3}, extend_cfg) == 150


def test_claims_pair_the_seeds_at_the_read_step_and_skip_methods_not_run():
    def arm(method, losses, accuracies):  # per seed: {step: loss}, the band accuracy L0 to s L0 at the read step
        def scores(v, a):
            return {
                "loss": {"32": v, "64": v, "128": v},
                "bands": {
                    name: {"accuracy": a, "hits": round(48 * a), "trials": 48, "floor": 0.25}
                    for name in extend_report.BANDS
                },
            }

        runs = {
            str(s): {"scores": {st: scores(v, accuracies[i]) for st, v in losses[i].items()}}
            for i, s in enumerate((1, 2, 3))
        }
        return {"base": 200.0, "method": method, "factor": 2.0, "runs": runs}

    r = {
        "block_size": 32,
        "read_step": 4,
        "bases": [200.0],
        "factors": [2.0],
        "finetune": {
            "rope-b200-none-x2": arm(
                "none",
                [{"0": 2.25, "2": 2.4, "4": 2.3}, {"0": 2.3, "2": 2.5, "4": 2.4}, {"0": 2.5, "2": 2.5, "4": 2.4}],
                [0.5, 0.4, 0.3],
            ),
            "rope-b200-linear-x2": arm(
                "linear",
                [{"0": 2.9, "2": 2.1, "4": 2.2}, {"0": 3.0, "2": 2.55, "4": 2.35}, {"0": 3.0, "2": 2.55, "4": 2.45}],
                [0.9, 0.8, 0.9],
            ),
        },
    }
    made = {c["id"]: c for c in extend_report.claims(r)}
    pi_loss, pi_l0, pi_band = "pi-loss-below-direct", "pi-L0-loss-same-as-base", "pi-retrieves-more-than-direct"
    assert list(made) == [pi_loss, pi_l0, pi_band]  # ntk, yarn and PoSE did not run: each claim once
    assert made[pi_loss]["diffs"] == pytest.approx([2.2 - 2.3, 2.35 - 2.4, 2.45 - 2.4])  # step 4, never step 2
    assert made[pi_loss]["claim"].startswith("(b) after 4 steps, PI has a lower loss than direct fine-tuning at 64")
    # (e)'s margin is PI's cost against the original model: PI at the read step against the base model, which is
    # direct fine-tuning's step 0
    assert made[pi_l0]["diffs"] == pytest.approx([2.2 - 2.25, 2.35 - 2.3, 2.45 - 2.5])
    assert made[pi_band]["diffs"] == pytest.approx([0.4, 0.4, 0.6]) and made[pi_band]["expect"] == "higher"
    judged = {c["id"]: c for c in extend_report.judge(list(made.values()))}
    # the L0 claim's TOST cannot pass with 3 seeds this spread and its difference is not shown beyond the margin:
    # its CI against the margin; the family holds its test of lying beyond and the other two claims' tests
    assert judged[pi_l0]["verdict"] == extend_report.UNTESTED and judged[pi_l0]["equivalence_p"] is None
    assert judged[pi_l0]["beyond_p_holm"] >= 0.05 and judged[pi_loss]["family"] == judged[pi_l0]["family"] == 3
    assert judged[pi_band]["power"] > judged[pi_band]["test"]["ci"][1] - judged[pi_band]["test"]["mean"] > 0
    row = next(
        line
        for line in extend_report.md_claims({"claims": list(judged.values())}).splitlines()
        if line.startswith(f"| {pi_l0} |")
    )
    assert f"| beyond ±{extend_report.SAME_MARGIN:g} |" in row and f"| **{extend_report.UNTESTED}** |" in row
    # where neither arm's hits (pooled over the seeds) clear the band's floor, the band claim compares two copiers:
    # it leaves the family (24 + 19 + 14 of 144 is 0.40, its interval above 0.25; 12 + 14 + 11 of 144 is not)
    assert not made[pi_band]["at_floor"]
    r["finetune"]["rope-b200-linear-x2"] = arm("linear", [{"0": 3.0, "4": 2.2}] * 3, [0.25, 0.29, 0.23])
    r["finetune"]["rope-b200-none-x2"] = arm("none", [{"0": 2.6, "4": 2.3}] * 3, [0.29, 0.23, 0.25])
    floored = {c["id"]: c for c in extend_report.judge(extend_report.claims(r))}
    assert floored[pi_band]["verdict"] == extend_report.AT_FLOOR and floored[pi_loss]["family"] == 2


def test_a_same_claim_is_tested_where_its_equivalence_test_can_pass():
    tight = {
        "id": "pi-L0-loss-same-as-base",
        "diffs": [0.001, -0.001, 0.002, 0.0, -0.002, 0.001],
        "expect": "same",
        "margin": extend_report.SAME_MARGIN,
    }
    (c,) = extend_report.judge([tight])
    assert c["verdict"] == "holds" and c["family"] == 2 and c["equivalence_p_holm"] < 0.05  # TOST and beyond


def test_a_same_claim_does_not_hold_where_its_difference_is_shown_to_lie_beyond_the_margin():
    """As (e) read in the committed default extension: a CI of [+0.023, +0.037] against a 0.02 margin."""
    wide = {
        "id": "pi-L0-loss-same-as-base",
        "claim": "(e) PI's loss at L0 is within 0.02 nats of direct fine-tuning's",
        "diffs": [0.031, 0.024, 0.036, 0.028, 0.033, 0.027],
        "expect": "same",
        "margin": extend_report.SAME_MARGIN,
    }
    (c,) = extend_report.judge([wide])
    assert c["equivalence_p_holm"] > 0.05 > c["beyond_p_holm"] and c["verdict"] == "does not hold"
    row = extend_report.md_claims({"claims": [c]}).splitlines()[-1]
    assert f"| TOST ±{extend_report.SAME_MARGIN:g} / beyond ±{extend_report.SAME_MARGIN:g} |" in row
    assert "| **does not hold** |" in row


def test_each_claim_is_one_row_of_the_table_with_its_own_id_between_two_methods_of_the_lab_or_one_and_its_floor():
    ids = [c.id for c in extend_report.CLAIMS]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-z0-9]+(-[a-zA-Z0-9]+)+", i) for i in ids)
    for c in extend_report.CLAIMS:
        assert c.a in extend.METHODS and c.b in {*extend.METHODS, extend_report.FLOOR} and c.a != c.b, c.id
        assert c.b != extend_report.FLOOR or c.figure == "band", c.id  # a floor is a band's
        assert c.at in (extend_report.BANDS if c.figure == "band" else ("L0", "sL0", "2sL0")), c.id
        assert (c.expect == "same") == (c.margin is not None) and c.expect in ("lower", "higher", "same"), c.id


@pytest.mark.parametrize("name", ["extend_gpu.toml", "extend_l256_cpu.toml"])
@pytest.mark.slow
def test_the_gpu_and_second_scale_configs_run_shrunk_on_the_cpu(data_dir, tmp_path, name):
    """Each config's own settings, with a tiny model, few steps and float32 on the CPU in place of its scale."""
    out = tmp_path / "ext"
    shrunk = [
        *TINY,
        "--seeds=1",
        "--methods=none,pose",
        "--base_check=2",
        "--base_gate=0",
        "--base_decay=2",
        "--max_iters=2",
        "--warmup_iters=1",
        "--eval_interval=2",
        "--finetune_lrs=1e-3",
        "--finetune_eval=2",
        "--plateau_span=2",
        "--finetune_steps=2",
        "--eval_tokens=128",
        "--probe_trials=2",
        "--probe_slots=8",
        "--probe_pool=1",
        "--recall_pairs=2",
        "--recall_fewest=1",
        "--recall_queries=2",
        "--probe_pairs=2",
        "--device=cpu",
        "--workers=1",
    ]
    extend.main([f"configs/{name}", *shrunk, f"--data_dir={data_dir}", f"--out_dir={out}"])
    res = json.loads((out / "results.json").read_text())
    assert set(res["finetune"]) == {f"rope-b{res['bases'][0]:g}-{m}-x{res['factors'][0]:g}" for m in ("none", "pose")}
    # both fine-tune under PI's protocol: on text alone, retrieval read zero-shot
    for folder in (out / "finetune").iterdir():
        assert json.loads((folder / "config.json").read_text())["batches"]["task"] == "text"


class Screened:
    """What extend.screening reads of a lab: 2 test seeds from 1337, 3 screened a role at the most, rates chosen on
    one selection seed."""

    settings = extend.ExtendConfig(seeds=2, screen_most=3, selection_seeds=1)
    train_cfg, bases = train.TrainConfig(seed=1337), [200.0]
    sweeps_rates = True  # its rates are chosen on a selection seed


def bases(passed):
    """done for base models: {seed: whether it passed}."""
    return {("base", 200.0, seed): {"passed": ok} for seed, ok in passed.items()}


@pytest.mark.slow
def test_a_lab_run_in_parts_on_machines_that_share_nothing_includes_the_seeds_and_reports_as_one_run(
    data_dir, tmp_path, capsys, monkeypatch
):
    """Seed 1338's base model fails the gate. One machine screens 1337, 1338 and 1339 and includes 1337 and 1339. In
    two parts, each in a folder of its own and keeping no checkpoint, part 1 screens 1337, part 2 1338 and then 1340.
    Merged, the rule reads the seeds in order as one run does: it trains 1339, which no part screened, and leaves
    1340 out; the report equals the one machine's, timings aside. Under bf16 autocast, what dtype=auto runs on a CPU
    with native bf16 (asked for here, where auto is float32), with rates swept on a selection seed that every part
    trains: the rate rule read from each part's own sweep."""
    probed = extend.probed

    def gated(lab, out, step):
        scores = probed(lab, out, step)
        return scores | {"slot": {j: 0.0 if out.name.endswith("seed1338") else 1.0 for j in scores["slot"]}}

    monkeypatch.setattr(extend, "probed", gated)
    args = [*LAB, "--base_gate=0.5", "--finetune_steps=2", f"--data_dir={data_dir}"]
    args += ["--methods=linear", "--dtype=bfloat16", "--finetune_lrs=1e-3,3e-3", "--selection_seeds=1"]
    extend.main([*args, f"--out_dir={tmp_path / 'one'}"])
    capsys.readouterr()
    merged = tmp_path / "merged"
    for part, seeds in ((1, "1337"), (2, "1340")):
        folder = tmp_path / f"part{part}"
        extend.main([*args, "--parts=2", f"--part={part}", "--keep_checkpoints=false", f"--out_dir={folder}"])
        assert f"part {part} of 2 done, test seeds {seeds}:" in capsys.readouterr().out
        assert not (folder / "results.json").exists() and not list(folder.rglob("*.pt"))
        shutil.copytree(folder, merged, dirs_exist_ok=True)  # what a user carries from each machine
    assert (merged / "base" / "rope-b200-seed1340").is_dir() and not (merged / "base" / "rope-b200-seed1339").exists()
    extend.main([*args, f"--out_dir={merged}"])
    one, both = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "merged"))
    assert both["screening"]["test"] == {
        "screened": [1337, 1338, 1339],
        "passed": [1337, 1339],
        "included": [1337, 1339],
    }
    assert untimed(both) == untimed(one)
    assert {json.loads(c.read_text())["dtype"] for c in merged.rglob("config.json")} == {"bfloat16"}
    assert both["selection_seeds"] == [1000]
    for arm in both["finetune"].values():  # each arm's rate one its sweep tried (widened as the rule read it)
        assert {"0.001", "0.003"} <= set(arm["sweep"]) and f"{arm['lr']:g}" in arm["sweep"]


def test_a_fine_tune_left_to_train_whose_base_kept_no_checkpoint_is_refused_in_one_line(data_dir, tmp_path):
    labs = []  # the plan extend.main would run with these settings
    sweep.tool_main("", extend.ExtendConfig, extend.Lab.make, labs.append)(
        [*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path}"]
    )
    lab = labs[0]
    job = lab.job((200.0, "none", 2.0), 3e-3, 1337)
    base = lab.folder(("base", 200.0, 1337))
    base.mkdir(parents=True)
    (base / lab.marker).write_text("{}")
    with pytest.raises(ValueError, match=f"kept no checkpoint \\(keep_checkpoints=false\\): delete {base}"):
        lab.check(job)


def test_seeds_are_screened_in_order_as_far_as_needed_and_included_once_every_earlier_one_is_decided():
    assert extend.screening(Screened, {}) == {
        "selection": {"screened": [1000], "passed": [], "included": []},
        "test": {"screened": [1337, 1338], "passed": [], "included": []},
    }
    found = extend.screening(Screened, bases({1000: True, 1338: False}))  # 1337 still training
    assert found["test"] == {"screened": [1337, 1338, 1339], "passed": [], "included": []}
    assert found["selection"]["included"] == [1000]
    found = extend.screening(Screened, bases({1338: False, 1339: True}))  # 1339 passed, 1337 undecided before it
    assert found["test"] == {"screened": [1337, 1338, 1339], "passed": [1339], "included": []}
    found = extend.screening(Screened, bases({1337: True, 1338: False, 1339: True, 1340: True}))
    assert found["test"] == {"screened": [1337, 1338, 1339], "passed": [1337, 1339], "included": [1337, 1339]}
    with pytest.raises(
        ValueError,
        match=r"1 of the 3 test seeds screened \(screen_most\) passed the gate "
        r"\(1337, 1338, 1339\); 2 needed: raise screen_most",
    ):
        extend.screening(Screened, bases({1337: False, 1338: True, 1339: False}))


def test_each_run_starts_once_what_it_needs_is_known_not_when_a_round_ends():
    """Two workers, a base model taking 10 time units and a fine-tune 1: the selection seed's sweeps start beside the
    test seeds' bases once seed 1000 passed; direct fine-tuning's widens as soon as its own rates ran, before PI's
    sweep has; and seed 1337's fine-tunes start once their rates are chosen, long before 1339 (screened once 1338
    failed) is decided."""
    started = []
    losses = {
        ("none", 1e-4): 3.0,
        ("none", 2e-4): 2.5,
        ("none", 4e-4): 2.0,
        ("none", 8e-4): 2.2,  # widened once
        ("linear", 1e-4): 3.0,
        ("linear", 2e-4): 2.0,
        ("linear", 4e-4): 2.5,
    }  # its best inside

    class Lab(Screened):
        seeds, unswept = None, 1
        job = staticmethod(lambda arm, lr, seed: ("finetune", *arm, seed, lr))
        loss = staticmethod(lambda run, arm: run["loss"])
        pick = classmethod(sweep.Plan.pick)  # the rule by loss every sweeping tool has (the extension's is below)

        @staticmethod
        def launch(wanted):
            done, running, now = {}, {}, 0  # running: {job: the time it ends}
            while True:
                for job in [j for j in wanted(done) if j not in done and j not in running][: 2 - len(running)]:
                    running[job] = now + (10 if job[0] == "base" else 1)
                    started.append((job[2], job[-1], job[-2]) if job[0] == "finetune" else job[-1])
                if not running:
                    return done
                job = min(running, key=running.get)  # of two ending together, the one started first
                now = running.pop(job)
                done[job] = {"passed": job[-1] != 1338} if job[0] == "base" else {"loss": losses[job[2], job[-1]]}

    none, pi = (200.0, "none", 2.0), (200.0, "linear", 2.0)
    done, sweeps, rates = sweep.Plan.sweep_and_test(
        Lab,
        [none, pi],
        {none: [1e-4, 2e-4, 4e-4], pi: [1e-4, 2e-4, 4e-4]},
        screen=lambda done: extend.screened_jobs(Lab, done),
    )
    assert started == [
        1000,
        1337,
        1338,
        ("none", 1e-4, 1000),
        ("none", 2e-4, 1000),
        ("none", 4e-4, 1000),
        ("none", 8e-4, 1000),
        ("linear", 1e-4, 1000),
        ("linear", 2e-4, 1000),
        ("linear", 4e-4, 1000),
        ("none", 4e-4, 1337),
        ("linear", 2e-4, 1337),
        1339,
        ("none", 4e-4, 1339),
        ("linear", 2e-4, 1339),
    ]
    assert sweeps == {none: [1e-4, 2e-4, 4e-4, 8e-4], pi: [1e-4, 2e-4, 4e-4]} and rates == {none: 4e-4, pi: 2e-4}


def test_rates_are_chosen_by_the_retrieval_kept_averaged_over_the_selection_seeds_once_as_many_passed():
    """Two selection seeds that disagree: seed 1000 alone would choose 2e-4 (the highest rate keeping 90% of its
    base's retrieval), seed 1002 alone 1e-4; their mean keeps 90% up to 2e-4. Seed 1001 fails the gate, so 1002 is
    screened in its place, and no sweep starts before it passed."""
    shares = {
        (1000, 1e-4): 0.99,
        (1000, 2e-4): 0.95,
        (1000, 4e-4): 0.80,
        (1002, 1e-4): 0.97,
        (1002, 2e-4): 0.86,
        (1002, 4e-4): 0.70,
    }  # the means 0.98, 0.905 and 0.75: the highest kept inside the sweep, no widening
    arm = (200.0, "linear", 2.0)

    class Lab(Screened):
        settings = extend.ExtendConfig(seeds=1, screen_most=3, selection_seeds=2)
        seeds, unswept = None, 1
        job = staticmethod(lambda arm, lr, seed: ("finetune", *arm, seed, lr))
        kept = staticmethod(lambda runs, done: statistics.fmean(run["kept"] for run in runs.values()))
        pick = classmethod(extend.Lab.pick)

        @staticmethod
        def launch(wanted):
            done = {}
            while todo := [j for j in wanted(done) if j not in done]:
                for job in todo:  # one round at a time: what each round asks is what the screening allowed
                    if job[0] == "base":
                        done[job] = {"passed": job[-1] != 1001}
                    else:
                        assert ("base", 200.0, 1002) in done, "a sweep started before its second seed passed"
                        done[job] = {"kept": shares.get(job[-2:])}  # a test seed's: none read
            return done

    found = extend.screening(Lab, bases({1000: True, 1001: False}))
    assert found["selection"]["screened"] == [1000, 1001, 1002] and extend.selection_seeds(Lab, found) is None
    found = extend.screening(Lab, bases({1000: True, 1001: False, 1002: True}))
    assert extend.selection_seeds(Lab, found) == [1000, 1002]
    done, sweeps, rates = sweep.Plan.sweep_and_test(
        Lab, [arm], {arm: [1e-4, 2e-4, 4e-4]}, screen=lambda done: extend.screened_jobs(Lab, done)
    )
    assert rates == {arm: 2e-4} and sweeps == {arm: [1e-4, 2e-4, 4e-4]}
    assert {job[-2] for job in done if job[0] == "finetune"} == {1000, 1002, 1337}


@pytest.mark.parametrize(
    "kept, widened, chosen",
    [
        ({1e-4: 0.99, 2e-4: 0.95, 4e-4: 0.92, 8e-4: 0.91}, [1e-4, 2e-4, 4e-4, 8e-4], 8e-4),  # upward, to the most
        ({1e-4: 0.99, 2e-4: 0.95, 4e-4: 0.5}, [1e-4, 2e-4, 4e-4], 2e-4),  # ... and one that does not
        ({1e-4: 0.99, 2e-4: 0.5}, [1e-4, 2e-4], 1e-4),  # the lowest kept, the next not: no widening down
        ({1e-4: 0.8, 2e-4: 0.5, 5e-5: 0.95}, [5e-5, 1e-4, 2e-4], 5e-5),  # none kept: one more downward
        ({1e-4: 0.8, 2e-4: 0.5, 5e-5: 0.85, 2.5e-5: 0.89}, [2.5e-5, 5e-5, 1e-4, 2e-4], 2.5e-5),  # none at the most
    ],
)
def test_the_rate_rule_takes_the_highest_rate_that_keeps_the_share_and_widens_past_an_edge_it_reaches(
    kept, widened, chosen
):
    arm = (200.0, "none", 2.0)

    class Lab(Screened):
        seeds, unswept = [1337], 1
        job = staticmethod(lambda arm, lr, seed: ("finetune", *arm, seed, lr))
        kept = staticmethod(lambda runs, done: next(iter(runs.values()))["kept"])
        pick = classmethod(extend.Lab.pick)

        @staticmethod
        def launch(wanted):
            done = {}
            while todo := [j for j in wanted(done) if j not in done]:
                done |= {job: {"passed": True} if job[0] == "base" else {"kept": kept.get(job[-1])} for job in todo}
            return done

    _, sweeps, rates = sweep.Plan.sweep_and_test(
        Lab, [arm], {arm: [1e-4, 2e-4]}, screen=lambda done: extend.screened_jobs(Lab, done)
    )
    assert sweeps == {arm: widened} and rates == {arm: chosen}


def test_the_share_kept_is_the_fine_tunes_accuracy_inside_L0_over_the_base_models_at_its_last_probe():
    """Counted by hand: the base's last probe (step 300, after the decay) hits 18 of 20 inside L0 = 8; the fine-tune
    hits 9 of 12 there at step 2 and 16 of 20 at step 4; its distances past L0 and its step 0 take no part."""

    def cell(trials, hits):
        return {"trials": trials, "hits": hits, "blind": {"rank 1": 0.1}}

    base = {
        "steps": 300,
        "curve": {
            "250": {"counts": {"cells": {"4": cell(10, 1)}}},
            "300": {"counts": {"cells": {"4": cell(10, 9), "8": cell(10, 9)}}},
        },
    }

    def target(*cells):
        return {"retrieval": {"target": {"cells": {k: cell(t, h) for k, t, h in cells}}}}

    finetune = {
        "scores": {
            "0": target(("4", 10, 0)),
            "2": target(("4", 6, 6), ("8", 6, 3), ("12", 6, 0)),
            "4": target(("4", 10, 10), ("8", 10, 6), ("16", 10, 10)),
        }
    }
    assert extend_report.kept(finetune, base, 8) == pytest.approx({"2": (9 / 12) / 0.9, "4": (16 / 20) / 0.9})


COMMITTED = ("extend_pi", "extend_wide", "extend", "extend_l256")
CHANGED = "| results | claim | at | 95% CI | as written | now | family |"


def changed_verdicts(name):
    """The rows of docs/extend.md's table for the committed results docs/name: each claim whose verdict the current
    claims and rules change, read again from the per-seed figures of results.json (a claim they no longer make,
    or one they add, with "—" on the side that lacks it)."""
    r = json.loads((ROOT / "docs" / name / "results.json").read_text())
    at = {c["id"] + c["claim"][c["claim"].rindex("(") :]: c for c in r["claims"]}
    now = {c["id"] + c["claim"][c["claim"].rindex("(") :]: c for c in extend_report.judge(extend_report.claims(r))}
    rows = []
    for key in [*at, *(k for k in now if k not in at)]:
        was, new = at.get(key), now.get(key)
        if was is None or new is None or was["verdict"] != new["verdict"]:
            claim_id, where = key.split("(")
            low, high = (new or was)["test"]["ci"]
            rows.append(
                f"| [{name}]({name}/results.md) | `{claim_id}` | {where[:-1]} | [{low:+.3f}, {high:+.3f}] | "
                f"{was['verdict'] if was else '—'} | {new['verdict'] if new else '—'} | "
                f"{r['claims'][0]['family']} → {next(iter(now.values()))['family']} |"
            )
    return rows


def test_the_guides_table_of_committed_verdicts_under_the_current_rules_is_what_they_read_from_the_files():
    """docs/extend.md lists every committed claim whose verdict the current claims and rules change: recomputed here
    from each results.json's per-seed figures, every row, and no other."""
    guide = (ROOT / "docs" / "extend.md").read_text()
    shown = guide.split(CHANGED + "\n|---")[1].split("\n\n")[0].splitlines()[1:]
    assert shown == [row for name in COMMITTED for row in changed_verdicts(name)]
