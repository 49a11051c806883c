"""lab/recipe.py: recipes x seeds trained on the base config with their changes, timed to a target val loss."""

import json

import pytest

from conftest import TINY, run
from files import read_log
from lab import recipe

# base and one recipe changing a model and a training setting, 2 seeds of a tiny model, evaluated every 2 steps
GRID = ["-m", "lab.recipe", *TINY, "--seeds=2", "--max_iters=6", "--eval_interval=2", "--log_interval=2"]
HOT = "--recipes=hot: mlp_act=relu2, learning_rate=0.01"


def first_at_or_below(out, target):
    """(iteration, elapsed_s) of the first logged evaluation at or below target, read here from the log."""
    for m in read_log(out / "metrics.jsonl"):
        if m.get("val_loss", float("inf")) <= target:
            return m["iter"], m["elapsed_s"]
    return None


@pytest.mark.slow
def test_recipes_train_their_changes_and_time_the_first_evaluation_at_the_target(data_dir, tmp_path, capsys):
    out = tmp_path / "rec"
    base = [*GRID, f"--data_dir={data_dir}", f"--out_dir={out}"]
    run(*base, HOT, "--target_loss=3.5")
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["base-seed1337", "base-seed1338", "hot-seed1337", "hot-seed1338"]
    for name in runs:
        saved = json.loads((out / "runs" / name / "config.json").read_text())
        hot = name.startswith("hot")
        assert saved["model"]["mlp_act"] == ("relu2" if hot else "gelu")
        assert saved["train"]["learning_rate"] == (0.01 if hot else 6e-4)
        assert saved["train"]["seed"] == int(name[-4:])
    results = json.loads((out / "results.json").read_text())
    for name, x in results["recipes"].items():
        hits = [first_at_or_below(out / "runs" / f"{name}-seed{r['seed']}", 3.5) for r in x["runs"]]
        assert [r["reached"] and r["reached"][:2] for r in x["runs"]] == [h and [*h] for h in hits]
        got = [h for h in hits if h]
        assert x["reached"] == len(got)
        if got:
            assert x["steps"]["mean"] == sum(h[0] for h in got) / len(got)
    assert "| hot | mlp_act=relu2, learning_rate=0.01 |" in (out / "results.md").read_text()

    # another target re-reports without training again: the checkpoints stay as they were (in-process from here)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/ckpt.pt")}
    recipe.main([*base[2:], HOT, "--target_loss=0.1"])
    assert stamps == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/ckpt.pt")}
    results = json.loads((out / "results.json").read_text())
    assert all(x["reached"] == 0 and x["steps"] is None for x in results["recipes"].values())
    assert "| 0/2 | N/A | N/A | N/A |" in (out / "results.md").read_text()

    # the same name with other changes is refused, naming the setting, before anything trains
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        recipe.main([*base[2:], "--recipes=hot: mlp_act=gelu, learning_rate=0.01"])
    err = capsys.readouterr().err
    assert refused.value.code == 1
    assert "mlp_act: 'relu2' there, 'gelu' now" in err and len(err.strip().splitlines()) == 1


def test_reached_is_the_first_evaluation_at_or_below_the_target(tmp_path):
    lines = [
        {"iter": 10, "elapsed_s": 1.0, "train_loss": 2.0},
        {"iter": 50, "elapsed_s": 5.0, "val_loss": 1.9},
        {"iter": 100, "elapsed_s": 10.0, "val_loss": 1.88},
        {"iter": 150, "elapsed_s": 15.0, "val_loss": 1.85},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    hit, evals = recipe.reached(tmp_path, 1.88)
    assert hit == (100, 10.0, 1.88) and len(evals) == 3
    assert recipe.reached(tmp_path, 1.8)[0] is None


@pytest.mark.slow
def test_a_bad_recipe_is_one_line(data_dir, tmp_path):
    proc = run(*GRID, "--recipes=hot: warp_speed=9", f"--data_dir={data_dir}", f"--out_dir={tmp_path}", check=False)
    assert proc.returncode == 1 and "'warp_speed=9' should be key=value" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_shipped_config_parses_with_its_recipes():
    import config
    import train
    from conftest import ROOT
    from model import GPTConfig

    recipe_cfg, model_cfg, train_cfg = config.parse(
        [str(ROOT / "configs/recipe_cpu.toml")], recipe.RecipeConfig, GPTConfig, train.TrainConfig
    )
    types = recipe.field_types(GPTConfig, recipe.MODEL_KEYS) | recipe.field_types(train.TrainConfig, recipe.TRAIN_KEYS)
    recipes = dict(recipe.parse_changes(recipe_cfg.recipes, types))
    assert recipes["muon"] == {"optimizer": "muon"} and train_cfg.dtype == "float32" and recipe_cfg.seeds == 3
