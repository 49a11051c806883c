"""Loss curves of one or several runs, side by side: train and val loss against steps and against wall seconds.

    python plot.py --runs=out-shakespeare-char-cpu                  out-shakespeare-char-cpu/loss.png
    python plot.py --runs=out-rope,out-sinusoidal --out=loss.png    several runs in one picture

Reads each run's metrics.jsonl (train.py writes it); the train loss is the step's, at every logged
step, and the val loss the evaluations'. Needs matplotlib (`pip install -e ".[plots]"`).
"""

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import config
from config import opt
from files import atomic_write, read_log

STYLE = {"train_loss": ("-", 1.0, "train"), "val_loss": ("o-", 2.0, "val")}  # line, width, legend word


def read_run(folder):
    """(label, [metrics line]) of a run folder; a line torn by a crash is skipped, as a resume drops it."""
    path = Path(folder) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"no metrics.jsonl in {str(folder)!r}; give the out_dir of a train.py run")
    lines = read_log(path)
    if not lines:
        raise ValueError(f"{path} holds no logged step yet")
    settings = Path(folder) / "config.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        return f"{Path(folder).name} ({json.loads(settings.read_text())['model']['pos_emb']})", lines
    return Path(folder).name, lines


def plot(runs, out):
    """runs [(label, lines)] as two panels, loss against step and against elapsed seconds, saved to out."""
    install = 'pip install matplotlib (or pip install -e ".[plots]")'
    config.optional_package("matplotlib", "plot.py", install).use("Agg")  # files only: no display needed
    plt = config.optional_package("matplotlib.pyplot", "plot.py", install)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, lines) in enumerate(runs):
        for key, (style, width, word) in STYLE.items():
            points = [m for m in lines if key in m]
            for ax, x in zip(axes, ("iter", "elapsed_s"), strict=True):
                ax.plot(
                    [m[x] for m in points],
                    [m[key] for m in points],
                    style,
                    lw=width,
                    markersize=3,
                    color=colors[i % len(colors)],
                    alpha=0.5 if key == "train_loss" else 1.0,
                    label=f"{label} {word}",
                )
    for ax, xlabel in zip(axes, ("step", "wall seconds (evaluation included)"), strict=True):
        ax.set(xlabel=xlabel, ylabel="loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes, not over a line
    fig.suptitle("Train loss (each logged step) and val loss (each evaluation)")
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


@dataclass
class PlotConfig:
    runs: str = opt("", "out_dir of each train.py run to draw, comma-separated")
    out: str = opt("", "the PNG to write (default: RUN/loss.png for one run, else loss.png)")

    def __post_init__(self):
        if not self.folders:
            raise ValueError("runs is empty; name the runs' out_dirs, e.g. --runs=out-rope,out-sinusoidal")

    @property
    def folders(self):
        return [r.strip() for r in self.runs.split(",") if r.strip()]


def plot_runs(pc):
    out = Path(pc.out or (Path(pc.folders[0]) / "loss.png" if len(pc.folders) == 1 else "loss.png"))
    plot([read_run(r) for r in pc.folders], out)
    print(f"wrote {out}")


def main(argv=None):
    config.main(argv, __doc__, (PlotConfig,), plot_runs)


if __name__ == "__main__":
    main()
