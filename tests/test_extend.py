"""lab/extend.py: base models, fine-tuning in stages with each scaling, the passkey probe, the report; resume by rerun."""

import json

from checkpoint import load_checkpoint
from conftest import TINY, run, same_tensors
from lab import extend, extend_report

# L0 = 32: rope and learned trained 4 steps, rope fine-tuned at 64 tokens for 4 steps in two stages
LAB = [*TINY, "--schemes=rope,learned", "--seeds=2", "--scalings=none,linear,yarn", "--factors=2",
       "--finetune_steps=0,2,4", "--max_iters=4", "--eval_interval=4", "--eval_tokens=128", "--passkey_trials=4",
       "--passkey_lengths=0.5,1,2", "--passkey_share=0.25"]


def test_the_lab_fine_tunes_each_scaling_and_reports_and_a_rerun_trains_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "ext"
    args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={out}"]
    run("lab/extend.py", *args)
    finetuned = sorted(p.name for p in (out / "finetune").iterdir())
    assert finetuned == [f"{sc}-x2-seed{s}" for sc in ("linear", "none", "yarn") for s in (1337, 1338)]
    for name in finetuned:  # the scaling is the run's own, saved where sampling, evaluation and resume read it
        cfg = load_checkpoint(out / "finetune" / name / "ckpt.pt")["model_config"]
        scaling = name.split("-")[0]
        assert (cfg["block_size"], cfg["rope_original_len"], cfg["rope_scaling"]) == (64, 32, scaling)
        assert cfg["rope_scaling_factor"] == (2.0 if scaling != "none" else 1.0)
        assert load_checkpoint(out / "finetune" / name / "ckpt.pt")["iter"] == 4

    res = json.loads((out / "results.json").read_text())
    yarn = res["finetune"]["yarn-x2"]
    assert list(yarn["loss"]) == ["0", "2", "4"] and set(yarn["loss"]["4"]) == {"32", "64", "128"}
    assert len(yarn["loss"]["4"]["64"]["values"]) == 2 and 0 < yarn["loss"]["4"]["64"]["mean"] < 10
    # step 0 is the base model with the scaling alone: at L0 linear and yarn change it, none does not
    base_rope_at_l0 = res["finetune"]["none-x2"]["loss"]["0"]["32"]["mean"]
    assert res["finetune"]["linear-x2"]["loss"]["0"]["32"]["mean"] != base_rope_at_l0
    learned, rope = res["base"]["learned"]["passkey"], res["base"]["rope"]["passkey"]
    assert learned["none"]["64"] is None and 0 <= learned["none"]["32"]["key"]["mean"] <= 1
    assert set(rope) == {"none", "linear", "yarn"} and set(rope["yarn"]) == {"64"}
    assert set(yarn["passkey"]) == {"16", "32", "64"}
    md = (out / "results.md").read_text()
    assert "(d) fine-tuned at 64, YaRN holds at 128 tokens better than PI" in md and "| learned | none | — |" in md

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")}
    again = run("lab/extend.py", *args)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")} == stamps, again.stdout
    assert json.loads((out / "results.json").read_text())["finetune"] == res["finetune"]

    # the stages add up to one run: fine-tuning straight to step 4 gives the same weights
    ft = json.loads((out / "finetune" / "yarn-x2-seed1337" / "config.json").read_text())
    straight = tmp_path / "straight"
    run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={straight}",
        *(f"--{k}={v}" for k, v in {**ft["model"], **ft["train"]}.items()
          if k not in ("out_dir", "resume", "vocab_size") and v is not None))
    assert same_tensors(load_checkpoint(straight / "ckpt.pt")["model"],
                        load_checkpoint(out / "finetune" / "yarn-x2-seed1337" / "ckpt.pt")["model"])


def test_bad_lab_settings_give_one_line_errors(data_dir, tmp_path, capsys):
    for bad, named in (("--schemes=alibi", "lacks rope"), ("--scalings=pi", "'pi' is unknown"),
                       ("--finetune_steps=10,20", "must start at 0"), ("--factors=0.5", "factors='0.5'")):
        try:
            extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", bad])
            code = 0
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and named in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_each_claim_is_judged_from_the_means_and_left_out_without_its_scalings():
    def run(scaling, curve):  # {step: (loss at 32, 64, 128)}
        return {"scaling": scaling, "factor": 2.0, "loss": {str(st): {L: {"mean": v} for L, v in zip(("32", "64", "128"), vals)}
                                                          for st, vals in curve.items()}}
    r = {"block_size": 32, "steps": [0, 10, 20], "finetune": {
        "none-x2": run("none", {0: (2.0, 2.5, 3.0), 10: (1.9, 2.0, 2.2), 20: (1.80, 1.85, 1.9)}),
        "linear-x2": run("linear", {0: (2.6, 2.7, 2.8), 10: (1.95, 1.9, 2.1), 20: (1.82, 1.80, 2.0)}),
        "yarn-x2": run("yarn", {0: (2.1, 2.2, 2.4), 10: (1.9, 1.8, 1.9), 20: (1.81, 1.79, 1.95)})}}
    verdicts = {text[:3]: (verdict, numbers) for text, verdict, numbers in extend_report.claims(r, 2.0)}
    assert verdicts["(a)"] == ("holds", "2.400 vs 2.800")  # the last: yarn at 128 (ntk did not run: left out)
    assert verdicts["(b)"] == ("holds", "1.800 vs 1.850")
    assert verdicts["(c)"] == ("holds", "YaRN reaches it at step 10")
    assert verdicts["(d)"] == ("holds", "1.950 vs 2.000")
    assert verdicts["(e)"] == ("holds", "1.820 vs 1.800, +0.020 (the base model: 2.000)")
    assert sum(text.startswith("(a)") for text, _, _ in extend_report.claims(r, 2.0)) == 2
    del r["finetune"]["yarn-x2"]
    assert [text[:3] for text, _, _ in extend_report.claims(r, 2.0)] == ["(b)", "(e)"]
