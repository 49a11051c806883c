"""The output formats every lab tool writes: markdown tables, mean ± std, and PNG plots (matplotlib optional)."""

from files import atomic_write


def pm(stat, spec=".4f"):
    """'mean ± std' of a mean_std dict; N/A for None."""
    if stat is None:
        return "N/A"
    return format(stat["mean"], spec) + ("" if stat["std"] is None else f" ± {stat['std']:{spec}}")


def md_table(header, rows, text_columns=1):
    """A markdown table: the first text_columns columns left-aligned, the numbers right-aligned."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
                      *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


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
    return dict(zip(names, colors * len(names)))


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
