"""Which training recipe reaches a validation loss soonest: recipes x seeds, steps and seconds to a target loss.

    python -m lab.recipe configs/recipe_cpu.toml [--key=value ...]

The config's own settings are the recipe "base"; each entry of `recipes` ('name: key=value, ...; name: ...',
any model or training setting) changes some of them. Every recipe trains for seeds seed, seed+1, ... into
out_dir/runs/<recipe>-seed<S>/ (one train.py run each, on the same batches seed by seed). A run reaches the
target at its first evaluation (every eval_interval steps) with val loss <= target_loss; its seconds are the
run's elapsed_s there, so the evaluations before it count, as they do in a whole command. out_dir receives
results.json, results.md (steps and seconds to the target, mean ± std over seeds) and, with matplotlib,
val_loss.png. Rerunning the same command skips finished runs and resumes an interrupted one.
"""

if not __package__:  # typed as a path, the import path holds lab/ and not the project: the imports below would fail
    raise SystemExit("run it as a module, from the project's folder: python -m lab.recipe CONFIG [--key=value ...]")

import functools
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tqdm import tqdm

import train
from config import opt
from files import atomic_write, read_log
from lab.grid import (
    NOT_SETTINGS,
    SeedSettings,
    check_run,
    evaluated,
    field_types,
    parse_changes,
    portable,
    run_dir,
    train_run,
    train_settings,
    write_json,
)
from lab.launch import command
from lab.report import Plots, dress, md_table, palette, pm
from lab.stats import mean_std
from model import GPTConfig

MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")  # the dataset sets it
TRAIN_KEYS = tuple(f.name for f in fields(train.TrainConfig) if f.name not in NOT_SETTINGS)


@dataclass
class RecipeConfig(SeedSettings):
    recipes: str = opt(
        "", "recipes beside the config's own ('base'): 'name: key=value, ...; name: ...', any model or training setting"
    )
    target_loss: float = opt(1.88, "the val loss whose first evaluation at or below it a run is timed to")


def reached(out, target):
    """(iteration, elapsed_s, val_loss) of the run's first evaluation at or below target, or None; and the
    run's evaluations as [(iteration, elapsed_s, val_loss)]."""
    evals = [(m["iter"], m["elapsed_s"], m["val_loss"]) for m in read_log(out / "metrics.jsonl") if "val_loss" in m]
    return next((e for e in evals if e[2] <= target), None), evals


def run_recipes(recipe_cfg, model_cfg, train_cfg, batch_cfg):
    types = field_types(GPTConfig, MODEL_KEYS) | field_types(train.TrainConfig, TRAIN_KEYS)
    recipes = {"base": {}} | dict(parse_changes(recipe_cfg.recipes, types, "recipe"))
    grid = []  # (name, model config, train config, run folder), every folder checked before anything trains
    for name, changes in recipes.items():
        g = replace(model_cfg, **{k: v for k, v in changes.items() if k in MODEL_KEYS})
        for seed in recipe_cfg.test_seeds(train_cfg):
            t = replace(train_cfg, seed=seed, **{k: v for k, v in changes.items() if k in TRAIN_KEYS})
            out = run_dir(t, name, seed)
            check_run(out, train_settings(g, t, batch_cfg))
            grid.append((name, g, t, out))
    runs = {name: [] for name in recipes}  # name -> [per seed: {"seed", "reached", "evals"}]
    for name, g, t, out in (bar := tqdm(grid, desc="recipe", unit="run")):
        bar.set_postfix_str(f"{name} seed {t.seed}")
        # the summary reads the run's own settings alone (check_run compares them); the target is read below
        evaluated(out / "summary.json", functools.partial(train_run, name, g, t, out, batch_cfg), {})
        hit, evals = reached(out, recipe_cfg.target_loss)
        runs[name].append({"seed": t.seed, "reached": hit, "evals": evals})
    results = {
        "settings": {"recipe": asdict(recipe_cfg), **portable(train_settings(model_cfg, train_cfg))},
        "recipes": {name: {"changes": recipes[name], "runs": rs, **figures(rs)} for name, rs in runs.items()},
    }
    out = Path(train_cfg.out_dir)
    write_json(out / "results.json", results)
    text = markdown(results, write_plot(results, out))
    atomic_write(out / "results.md", lambda f: f.write(text.encode()))
    print(text)


def figures(runs):
    """Steps and seconds to the target (mean_std over the seeds that reached it) and the final val loss."""
    hits = [r["reached"] for r in runs if r["reached"]]
    return {
        "reached": len(hits),
        "steps": mean_std(h[0] for h in hits) if hits else None,
        "seconds": mean_std(h[1] for h in hits) if hits else None,
        "final_val_loss": mean_std(r["evals"][-1][2] for r in runs),
    }


def markdown(results, plots):
    recipe_cfg, base = results["settings"]["recipe"], results["recipes"]["base"]
    rows = []
    for name, x in results["recipes"].items():
        changes = ", ".join(f"{k}={v}" for k, v in x["changes"].items()) or "the config as it is"
        ratio = (
            f"{base['seconds']['mean'] / x['seconds']['mean']:.2f}x"
            if x["seconds"] and base["seconds"] and x["reached"] == recipe_cfg["seeds"]
            else "N/A"
        )
        rows.append(
            [
                name,
                changes,
                f"{x['reached']}/{recipe_cfg['seeds']}",
                pm(x["steps"], ".0f"),
                pm(x["seconds"], ".1f"),
                ratio,
                pm(x["final_val_loss"]),
            ]
        )
    table = md_table(
        ["recipe", "changes", "reached", "steps", "seconds", "speed-up (seconds)", "final val loss"],
        rows,
        text_columns=2,
    )
    return (
        f"# Steps and seconds to val loss <= {recipe_cfg['target_loss']}\n\n"
        f"Mean ± std over {recipe_cfg['seeds']} seeds of the runs that reached it, at the first evaluation (every "
        f"{results['settings']['train']['eval_interval']} steps) at or below it; seconds are elapsed training "
        f"time there, evaluations included. The speed-up is base's mean seconds over the recipe's.\n\n"
        + table
        + "\n\n"
        + plots.section()
        + "\n"
    )


def write_plot(results, out):
    """val_loss.png: val loss against seconds, each seed a line (report.Plots: none without matplotlib)."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    colors = palette(plt, list(results["recipes"]))
    for name, x in results["recipes"].items():
        for i, r in enumerate(x["runs"]):
            ax.plot(
                [e[1] for e in r["evals"]],
                [e[2] for e in r["evals"]],
                color=colors[name],
                alpha=0.8,
                label=name if i == 0 else None,
            )
    ax.axhline(results["settings"]["recipe"]["target_loss"], color="gray", linestyle=":")
    ax.set(ylim=(None, 2.6))
    title = "val loss against training seconds (each seed a line)"
    dress(ax, title, "seconds", "val loss")
    plots.save(fig, "val_loss.png", title)
    return plots


def main(argv=None):
    command(argv, __doc__, RecipeConfig, run_recipes)


if __name__ == "__main__":
    main()
