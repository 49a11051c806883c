"""lab/extend.py: base models trained until retrieval is learned, rates swept on a held-out seed, fine-tunes run
to their plateau in stages that add up to one run, retrieval by distance, the claims with their verdicts over one
stated Holm family; resume by rerun."""

import json
import re

import pytest

import train
from checkpoint import load_checkpoint
from conftest import TINY, run, same_tensors
from lab import extend, extend_report
from lab.stats import verdicts

# L0 = 32: RoPE (base 200) on 2 test seeds and the selection seed, 2 stages of 2 steps; fine-tuned at 64 tokens
LAB = [*TINY, "--rope_bases=200", "--seeds=2", "--methods=none,linear,yarn,pose", "--factors=2", "--base_check=2",
       "--max_iters=4", "--eval_interval=2", "--finetune_lrs=3e-3", "--finetune_eval=2", "--plateau_span=4",
       "--finetune_max=8", "--finetune_scored=0,2", "--early_step=2", "--eval_tokens=128", "--probe_trials=2",
       "--probe_distances=4", "--recall_share=0.5", "--recall_pairs=2", "--recall_queries=3", "--probe_pairs=2"]


def test_the_lab_sweeps_rates_on_a_held_out_seed_fine_tunes_to_the_plateau_and_a_rerun_trains_nothing(data_dir,
                                                                                                      tmp_path, capsys):
    out = tmp_path / "ext"
    args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={out}"]
    run("-m", "lab.extend", *args, "--workers=2")  # two runs at a time, each in a process of its own
    res = json.loads((out / "results.json").read_text())
    sweep = sorted(p.name for p in (out / "sweep").iterdir())
    tests = sorted(p.name for p in (out / "finetune").iterdir())
    assert all(name.endswith("-seed1000") for name in sweep) and len(sweep) == 4  # a rate for each method
    assert {name.rsplit("-seed", 1)[1] for name in tests} == {"1337", "1338"}  # the selection seed tests nothing
    for arm in res["finetune"].values():
        assert set(arm["runs"]) == {"1337", "1338"} and arm["lr"] == float(min(arm["sweep"], key=arm["sweep"].get))
    for name in tests:  # the scaling and L0 are the run's own, saved where sampling, evaluation and resume read them
        ckpt = load_checkpoint(out / "finetune" / name / "ckpt.pt")
        cfg, method = ckpt["model_config"], name.split("-")[2]
        assert (cfg["original_len"], cfg["rope_base"]) == (32, 200.0) and cfg["block_size"] == (32 if method == "pose"
                                                                                                 else 64)
        assert ckpt["iter"] == json.loads((out / "finetune" / name / "result.json").read_text())["plateau"]
    yarn = res["finetune"]["rope-b200-yarn-x2"]
    assert set(yarn["by_step"]) == {"0", "2", "plateau"} and set(yarn["by_step"]["plateau"]["loss"]) == {"32", "64",
                                                                                                          "128"}
    run0 = yarn["runs"]["1337"]
    assert set(run0["scores"]["2"]["retrieval"]) == {"target"} and run0["plateau"] in (4, 6, 8)
    assert set(run0["scores"][str(run0["plateau"])]["retrieval"]) == {"target", "past"}  # 64 and 128 tokens
    assert max(map(int, run0["scores"]["2"]["retrieval"]["target"]["distance"])) < 64
    assert [int(st) for st in run0["l0_curve"]] == list(range(0, run0["plateau"] + 1, 2))
    assert res["regime"][-1]["name"].startswith("LLaMA-2-7B") and res["memory"]["pose x2"] < res["memory"]["linear x2"]
    md = (out / "results.md").read_text()
    family = int(re.search(r"one family of (\d+) tests", md)[1])
    assert family == len(res["claims"]) == res["claims"][0]["family"]  # the family the guide states is the one run
    assert {c["verdict"] for c in res["claims"]} <= {"holds", "does not hold", "inconclusive"}

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")}
    extend.main(args)  # in-process from here on: the command itself ran above
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")} == stamps, capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["finetune"] == res["finetune"]

    # a finished folder is reused only with the settings it records, and only whole
    code, err = extend_main(capsys, *args, "--n_embd=48")
    assert code == 1 and "n_embd: 32 there, 48 now" in err and f"{out / 'base'}" in err and err.count("\n") == 1, err
    step = out / "finetune" / "rope-b200-none-x2-lr0.003-seed1337" / "step2.json"
    intact = step.read_text()
    step.write_text(intact[:50])  # truncated: it cannot be made again, the checkpoint having moved on
    code, err = extend_main(capsys, *args)
    assert code == 1 and err.startswith(f"error: {step} cannot be read (") and f"delete {step.parent} and" in err, err
    step.write_text(intact)

    # the stages add up to one run: fine-tuning straight to the plateau gives the same weights
    folder = out / "finetune" / "rope-b200-yarn-x2-lr{:g}-seed1337".format(yarn["lr"])
    ft = json.loads((folder / "config.json").read_text())
    straight = tmp_path / "straight"
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={straight}",
                *(f"--{k}={v}" for k, v in {**ft["model"], **ft["train"], **ft["batches"]}.items()
                  if k not in ("out_dir", "resume", "vocab_size") and v is not None)])
    assert same_tensors(load_checkpoint(straight / "ckpt.pt")["model"], load_checkpoint(folder / "ckpt.pt")["model"])


def extend_main(capsys, *args):
    """extend.main in-process: (exit code, stderr)."""
    try:
        extend.main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_a_dry_run_prints_every_launch_with_its_job_count(data_dir, tmp_path, capsys):
    extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ext'}", "--dry_run", "--launcher=slurm",
                 "--methods=none,pose", "--finetune_lrs=1e-3,3e-3"])
    lines = capsys.readouterr().out.splitlines()
    # launch 1: 3 bases (the selection seed's and 2 test seeds'), then 2 methods x 2 rates on the selection seed
    assert lines[0].startswith("dry run, launch 1: 7 Slurm jobs named 'extend'") and "array 2" in lines[2], lines
    assert lines[3].startswith("then up to 2 launches of at most 2 jobs: one more rate on selection seed 1000")
    assert lines[4].startswith("last launch: at most 4 jobs, test seeds 1337, 1338 of 2 arms") and len(lines) == 5
    assert not (tmp_path / "ext").exists()


def test_bad_lab_settings_give_one_line_errors(data_dir, tmp_path, capsys):
    for bad, named in (("--methods=pi", "'pi' is unknown"), ("--finetune_scored=10,20", "must start at 0"),
                       ("--factors=0.5", "factors='0.5'"), ("--recall_share=0", "recall_share=0"),
                       ("--selection_seed=1338", "selection_seed=1338 is one of the test seeds [1337, 1338]"),
                       ("--pos_emb=alibi", "fine-tunes RoPE"), ("--workers=0", "workers=0 must be a positive integer"),
                       ("--plateau_span=3", "multiples of finetune_eval=2"),
                       ("--factors=2,inf", "factors='2,inf' must list finite numbers >= 1.0"),
                       ("--finetune_lrs=nan", "finetune_lrs='nan' must list finite numbers")):
        try:
            extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", bad])
            code = 0
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and named in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_a_fine_tune_stops_where_its_l0_loss_levels_off():
    ec = extend.ExtendConfig(finetune_eval=50, plateau_span=100, plateau_tol=0.01)
    assert not extend.plateaued({"0": 3.0, "50": 2.5}, ec)  # too early to say
    assert not extend.plateaued({"0": 3.0, "50": 2.5, "100": 2.4}, ec)
    assert extend.plateaued({"0": 3.0, "50": 2.5, "100": 2.495, "150": 2.491}, ec)  # -0.009 over the last 100 steps


def test_claims_pair_the_seeds_read_each_run_at_its_own_plateau_and_skip_methods_not_run():
    def arm(method, losses, kmaxes, plateaus):  # per seed: {step: loss at 64}, {step: k_max at 20%}, plateau
        def scores(v, k):
            return {"loss": {"32": v, "64": v, "128": v},
                    "retrieval": {where: {"kmax": {"pi": k, "strict": 0}} for where in ("target", "past")}}
        runs = {str(s): {"plateau": p, "scores": {st: scores(v, kmaxes[i][st]) for st, v in losses[i].items()}}
                for i, (s, p) in enumerate(zip((1, 2), plateaus))}
        return {"base": 200.0, "method": method, "factor": 2.0, "runs": runs}
    r = {"block_size": 32, "early_step": 2, "bases": [200.0], "factors": [2.0], "finetune": {
        "rope-b200-none-x2": arm("none", [{"0": 2.5, "2": 2.4, "4": 2.3}, {"0": 2.6, "2": 2.5, "6": 2.4}],
                                 [{"0": 4, "2": 4, "4": 8}, {"0": 4, "2": 4, "6": 8}], [4, 6]),
        "rope-b200-linear-x2": arm("linear", [{"0": 2.9, "2": 2.45, "6": 2.2}, {"0": 3.0, "2": 2.55, "4": 2.35}],
                                   [{"0": 0, "2": 8, "6": 64}, {"0": 0, "2": 8, "4": 64}], [6, 4]),
    }}
    made = {c["claim"][:3]: c for c in extend_report.claims(r)}
    assert set(made) == {"(b)", "(e)", "(f)", "(g)"}  # ntk, yarn and PoSE did not run
    assert made["(b)"]["diffs"] == pytest.approx([2.2 - 2.3, 2.35 - 2.4]) and made["(b)"]["expect"] == "lower"
    assert made["(e)"]["expect"] == "same" and made["(e)"]["margin"] == extend_report.SAME_MARGIN
    assert made["(f)"]["diffs"] == [4, 4] and made["(g)"]["diffs"] == [56, 56] and made["(g)"]["expect"] == "higher"
    row = next(line for line in extend_report.md_claims(verdicts(list(made.values()))).splitlines()
               if line.startswith("| (e)"))
    assert f"| TOST ±{extend_report.SAME_MARGIN:g} |" in row  # a "same" claim shows its equivalence test's p


@pytest.mark.parametrize("name", ["extend_gpu.toml", "extend_l256_cpu.toml"])
def test_the_gpu_and_second_scale_configs_run_shrunk_on_the_cpu(data_dir, tmp_path, name):
    """Each config's own settings, with a tiny model, few steps and float32 on the CPU in place of its scale."""
    out = tmp_path / "ext"
    shrunk = [*TINY, "--seeds=1", "--methods=none,pose", "--base_check=2", "--max_iters=2", "--eval_interval=2",
              "--finetune_lrs=1e-3", "--finetune_eval=2", "--plateau_span=2", "--finetune_max=4",
              "--finetune_scored=0,2", "--early_step=2", "--eval_tokens=128", "--probe_trials=2", "--probe_distances=2",
              "--recall_pairs=2", "--recall_queries=2", "--probe_pairs=2", "--device=cpu", "--workers=1"]
    extend.main([f"configs/{name}", *shrunk, f"--data_dir={data_dir}", f"--out_dir={out}"])
    res = json.loads((out / "results.json").read_text())
    assert set(res["finetune"]) == {f"rope-b{res['bases'][0]:g}-{m}-x{res['factors'][0]:g}" for m in ("none", "pose")}
