"""What every lab tool writes: the regime table (RoPE's dimensionless ratios against the papers' model), markdown
tables, mean ± std, and PNG plots (matplotlib optional)."""

import itertools
import math

import scalings
from files import atomic_write

LLAMA2 = {"name": "LLaMA-2-7B (the papers' model)", "head_dim": 128, "base": 10000.0, "L0": 4096}  # its config.json:
# hidden_size 4096 / 32 heads, max_position_embeddings 4096; rope_theta 10,000 (transformers' default, Meta's code)


def regime(name, head_dim, base, L0):
    """The dimensionless ratios a small model must match to stand in for a large one: RoPE's longest wavelength
    2 pi base^((d-2)/d) over L0, the turns the fastest pair makes within L0 (L0 / 2 pi), and the shares of YaRN's
    pairs (alpha = 1, beta = 32, as deployed) kept (theta), ramped and fully interpolated (theta / s)."""
    ramp = scalings.yarn_ramp(head_dim, base, L0)
    pairs = head_dim // 2
    return {
        "name": name,
        "head_dim": head_dim,
        "pairs": pairs,
        "base": base,
        "L0": L0,
        "longest_over_L0": 2 * math.pi * base ** ((head_dim - 2) / head_dim) / L0,
        "fastest_turns": L0 / (2 * math.pi),
        "yarn_kept": int((ramp == 0).sum()) / pairs,
        "yarn_ramped": int(((ramp > 0) & (ramp < 1)).sum()) / pairs,
        "yarn_interpolated": int((ramp == 1).sum()) / pairs,
    }


def regime_rows(configs):
    """regime() of each (name, head_dim, base, L0), then LLaMA-2-7B's row."""
    return [regime(*c) for c in configs] + [regime(*LLAMA2.values())]


def md_regime(rows):
    return (
        "## The regime: RoPE's ratios against the papers' model\n\nA small model stands in for a large one only "
        "with the dimensionless ratios matched: the longest wavelength against the trained context, how often the "
        "fastest pair turns within it, and which of YaRN's bands its pairs fall in (alpha = 1, beta = 32). The "
        "shares are those of YaRN as deployed (its authors' code and transformers, which the lab's YaRN follows): "
        "the band edges, the pairs that turn 32 times and once within L0, rounded to pair indices and clamped to "
        "the head, the ramp linear in the pair index between. The paper's text defines the bands by turns "
        "instead: a pair turning more than 32 times in L0 keeps its frequency, one turning less than once is "
        "interpolated. The two differ where the fastest pair turns 32 times or fewer: there the turns definition "
        "keeps no pair, while the deployed ramp keeps pair 0, its lower edge clamped to it.\n\n"
        + md_table(
            [
                "model",
                "head size",
                "pairs",
                "base",
                "L0",
                "longest wavelength / L0",
                "fastest pair's turns in L0",
                "YaRN as deployed: kept / ramped / interpolated",
            ],
            [
                [
                    r["name"],
                    r["head_dim"],
                    r["pairs"],
                    f"{r['base']:,.0f}",
                    f"{r['L0']:,}",
                    f"{r['longest_over_L0']:.1f}",
                    f"{r['fastest_turns']:.0f}",
                    f"{r['yarn_kept']:.0%} / {r['yarn_ramped']:.0%} / {r['yarn_interpolated']:.0%}",
                ]
                for r in rows
            ],
        )
    )


def pm(stat, spec=".4f"):
    """'mean ± std' of a mean_std dict; N/A for None."""
    if stat is None:
        return "N/A"
    return format(stat["mean"], spec) + ("" if stat["std"] is None else f" ± {stat['std']:{spec}}")


def md_table(header, rows, text_columns=1):
    """A markdown table: the first text_columns columns left-aligned, the numbers right-aligned."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(align) + "|",
            *("| " + " | ".join(map(str, r)) + " |" for r in rows),
        ]
    )


NO_PLOTS = "Plots skipped: matplotlib is not installed (`pip install matplotlib` or `pip install -e .[plots]`)."


def pyplot():
    """matplotlib.pyplot drawing to files, or None when matplotlib (an optional extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def palette(plt, names):
    """{name: colour}: the default cycle's 10 colours while they suffice; past them one colour would stand for
    two lines, so tab20's 20."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(names) > len(colors):
        colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    return dict(zip(names, itertools.cycle(colors)))


class Plots:
    """The PNG plots a tool writes into out, each saved atomically and listed as (file, title) for its results.md;
    with matplotlib missing, `plt` is None and the tool draws nothing."""

    def __init__(self, out):
        self.plt, self.out, self.written = pyplot(), out, []

    def save(self, fig, file, title, tight=True):
        if tight:
            fig.tight_layout()
        atomic_write(self.out / file, lambda f: fig.savefig(f, format="png", dpi=110))
        self.plt.close(fig)
        self.written.append((file, title))

    def section(self):
        """results.md's plots section."""
        body = "\n".join(f"![{title}]({file})" for file, title in self.written) if self.plt else NO_PLOTS
        return "## Plots\n\n" + body


def dress(ax, title, xlabel, ylabel, legend="beside"):
    """An axes' title, labels and light grid, and its legend beside the axes (never over a line), inside, or none."""
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if legend == "beside":
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    elif legend:
        ax.legend(fontsize="small")
