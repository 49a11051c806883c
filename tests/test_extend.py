"""lab/extend.py: base models (RoPE's learning curve of retrieval), fine-tuning in stages with each scaling, the
retrieval grid, the claims with their verdicts, more seeds where a p is unsettled; resume by rerun."""

import json

import pytest

from checkpoint import load_checkpoint
from conftest import TINY, run, same_tensors
from lab import extend, extend_report

# L0 = 32: rope (base 200) and learned trained 4 steps in 2 stages, rope fine-tuned at 64 tokens for 4 steps
LAB = [*TINY, "--schemes=rope,learned", "--rope_bases=200", "--seeds=2", "--more_seeds=0", "--scalings=none,linear,yarn",
       "--factors=2", "--base_stages=2,4", "--finetune_steps=0,2,4", "--max_iters=4", "--eval_interval=4",
       "--eval_tokens=128", "--probe_trials=4", "--probe_lengths=0.5,1,2", "--probe_depths=0,1", "--recall_share=0.5",
       "--recall_pairs=2"]


def test_the_lab_fine_tunes_each_scaling_and_reports_and_a_rerun_trains_nothing(data_dir, tmp_path):
    out = tmp_path / "ext"
    args = [*LAB, f"--data_dir={data_dir}", f"--out_dir={out}"]
    run("lab/extend.py", *args, "--workers=2")  # two runs at a time, each in a process of its own
    finetuned = sorted(p.name for p in (out / "finetune").iterdir())
    assert finetuned == [f"rope-b200-{sc}-x2-seed{s}" for sc in ("linear", "none", "yarn") for s in (1337, 1338)]
    for name in finetuned:  # the scaling is the run's own, saved where sampling, evaluation and resume read it
        ckpt = load_checkpoint(out / "finetune" / name / "ckpt.pt")
        cfg, scaling = ckpt["model_config"], name.split("-")[2]
        assert (cfg["block_size"], cfg["original_len"], cfg["rope_scaling"], cfg["rope_base"]) == (64, 32, scaling,
                                                                                                    200.0)
        assert cfg["rope_scaling_factor"] == (2.0 if scaling != "none" else 1.0) and ckpt["iter"] == 4

    res = json.loads((out / "results.json").read_text())
    assert res["regime"][0]["ratio_to_L0"] == pytest.approx(2 * 3.14159265 * 200 ** (14 / 16) / 32, rel=1e-6)
    yarn = res["finetune"]["rope-b200-yarn-x2"]
    assert list(yarn["loss"]) == ["0", "2", "4"] and set(yarn["loss"]["4"]) == {"32", "64", "128"}
    assert len(yarn["loss"]["4"]["64"]["values"]) == 2 and set(yarn["retrieval"]["4"]) == {"16", "32", "64"}
    assert set(yarn["retrieval"]["4"]["64"]) == {"0.0", "1.0"} and yarn["window"]["4"]["mean"] in (0, 16, 32, 64)
    # step 0 is the base model with the scaling alone: at L0 linear changes it, none does not
    assert res["finetune"]["rope-b200-linear-x2"]["loss"]["0"]["32"]["mean"] != \
        res["finetune"]["rope-b200-none-x2"]["loss"]["0"]["32"]["mean"]
    rope, learned = res["base"]["rope-b200"], res["base"]["learned"]
    assert list(rope["curve"]) == ["2", "4"] and set(rope["retrieval"]) == {"none", "linear", "yarn"}
    assert learned["retrieval"]["none"]["64"] is None and set(rope["retrieval"]["yarn"]) == {"64"}
    assert {c["verdict"] for c in res["claims"]} <= {"holds", "does not hold", "inconclusive"}
    md = (out / "results.md").read_text()
    assert "(d) fine-tuned at 64, YaRN holds a lower loss than PI at 128 tokens (base 200, s = 2)" in md
    assert "## The effective context window against fine-tuning steps" in md and "(2 at a time)" in md

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")}
    again = run("lab/extend.py", *args)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.pt")} == stamps, again.stdout
    assert json.loads((out / "results.json").read_text())["finetune"] == res["finetune"]

    # the stages add up to one run: fine-tuning straight to step 4 gives the same weights
    ft = json.loads((out / "finetune" / "rope-b200-yarn-x2-seed1337" / "config.json").read_text())
    straight = tmp_path / "straight"
    run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={straight}",
        *(f"--{k}={v}" for k, v in {**ft["model"], **ft["train"], **ft["batches"]}.items()
          if k not in ("out_dir", "resume", "vocab_size") and v is not None))
    assert same_tensors(load_checkpoint(straight / "ckpt.pt")["model"],
                        load_checkpoint(out / "finetune" / "rope-b200-yarn-x2-seed1337" / "ckpt.pt")["model"])


def test_an_unsettled_claim_brings_more_seeds(data_dir, tmp_path, monkeypatch, capsys):
    flagged = iter([True])  # the first verdicts ask for more seeds, the next do not

    def verdicts(claims):
        ask = next(flagged, False)
        return [dict(c, test={"mean": 0, "ci": None, "p": None}, p_holm=None, equivalence_p_holm=None,
                     verdict="inconclusive", more_seeds=ask) for c in claims]
    monkeypatch.setattr(extend_report, "verdicts", verdicts)
    args = [a for a in LAB if not a.startswith(("--more_seeds", "--schemes", "--scalings"))]
    extend.main([*args, "--schemes=rope", "--scalings=none,linear", "--more_seeds=1", f"--data_dir={data_dir}",
                 f"--out_dir={tmp_path}"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["seeds"]["finetune"] == [1337, 1338, 1339] and "adding seeds 1339" in capsys.readouterr().out
    assert (tmp_path / "finetune" / "rope-b200-linear-x2-seed1339").is_dir()


def test_bad_lab_settings_give_one_line_errors(data_dir, tmp_path, capsys):
    for bad, named in (("--schemes=alibi", "lacks rope"), ("--scalings=pi", "'pi' is unknown"),
                       ("--finetune_steps=10,20", "must start at 0"), ("--factors=0.5", "factors='0.5'"),
                       ("--recall_share=0", "recall_share=0"), ("--base_stages=2,3", "must end at max_iters=4"),
                       ("--workers=0", "workers=0 must be a positive integer")):
        try:
            extend.main([*LAB, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", bad])
            code = 0
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and named in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_claims_pair_the_seeds_and_are_left_out_without_their_scalings():
    def ft(sc, loss, window):  # loss {step: {L: [per seed]}}, window {step: [per seed]}
        return {"base": 200.0, "scaling": sc, "factor": 2.0, "loss": {st: {L: {"values": v} for L, v in by_l.items()}
                                                                     for st, by_l in loss.items()},
                "window": {st: {"values": v} for st, v in window.items()}}

    def curve(a, b):  # losses at 32, 64, 128 tokens, two seeds, the same at both steps
        return {st: {"32": a, "64": b, "128": b} for st in ("0", "10", "20")}
    r = {"block_size": 32, "steps": [0, 10, 20], "bases": [200.0], "factors": [2.0], "finetune": {
        "rope-b200-none-x2": ft("none", curve([2.0, 2.1], [2.5, 2.6]), {"0": [32, 32], "10": [32, 32], "20": [32, 64]}),
        "rope-b200-linear-x2": ft("linear", curve([2.02, 2.13], [2.4, 2.45]), {"0": [32, 32], "10": [64, 64], "20": [64, 64]}),
    }}
    made = {c["claim"][:3]: c for c in extend_report.claims(r)}
    assert set(made) == {"(b)", "(e)", "(f)"}  # ntk and yarn did not run
    assert made["(b)"]["diffs"] == pytest.approx([2.4 - 2.5, 2.45 - 2.6]) and made["(b)"]["expect"] == "lower"
    assert made["(e)"]["expect"] == "same" and made["(e)"]["margin"] == extend_report.SAME_MARGIN
    assert made["(f)"]["diffs"] == [32, 32] and made["(f)"]["expect"] == "higher"
