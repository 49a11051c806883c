"""The figures of docs/rope.md, drawn from rope.py and scalings.py themselves: pairs turning with position, each
pair's wavelength under every scaling, RoFormer's long-term decay, and the relative-position identity checked.

    python rope_figures.py --out_dir=docs/rope                          the four PNGs of docs/rope.md
    python rope_figures.py --dim=128 --original_len=4096 --factor=8     another head, context and factor

The decay figure is drawn at d = 128 whatever --dim says, as RoFormer's Figure 2 is (--decay_dim changes it).

Writes pairs.png, wavelengths.png, decay.png and identity.png into out_dir and prints what docs/rope.md quotes.
Needs matplotlib (`pip install -e ".[plots]"`).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch

import config
import rope
import scalings
from config import opt
from files import atomic_write

SHOWN_PAIRS = 4  # circles in the pairs figure: the fastest pair, the slowest, and two spread between
CIRCLE_POSITIONS = 13  # positions 0..12 on each circle: the fastest pair (theta = 1) goes round almost twice
DECAY_DISTANCES = 256  # RoFormer's Figure 2 reaches a relative distance of about 250
DECAY_READ = (0, 50, 250)  # distances marked on the decay figure, to compare it with the paper's by eye
IDENTITY_POSITIONS = 48  # 48 * 48 pairs (m, n) spread over the stretched context: thousands of scores, still fast
IDENTITY_GRID = 64  # the heat map's positions 0..63: several turns of the fast pairs, each cell still visible
HEAD = ("be an even integer >= 4", lambda v: v >= 4 and v % 2 == 0)  # pairs, and NTK's exponent d/(d-2) needs d > 2
# each scaling's name as docs/rope.md writes it, and its line: YaRN and Llama 3 keep the fast pairs as plain RoPE
# does and slow the slowest as PI does, so where curves coincide, markers of different shapes and sizes still show
SCALING_LINES = {
    scalings.NO_SCALING: ("plain RoPE", {"color": "0.6", "lw": 6, "alpha": 0.6, "zorder": 0}),  # wide, beneath all
    scalings.LINEAR: ("PI", {"marker": "o", "markersize": 9, "mfc": "none", "ls": "-"}),
    scalings.NTK: ("NTK", {"marker": "D", "markersize": 3, "ls": "-"}),
    scalings.DYNAMIC: ("dynamic NTK", {"marker": "v", "markersize": 4, "ls": "-"}),
    scalings.YARN: ("YaRN", {"marker": "s", "markersize": 6, "mfc": "none", "ls": "--"}),
    scalings.LLAMA3: ("Llama 3", {"marker": "x", "markersize": 5, "ls": ":"}),
}


@dataclass
class FiguresConfig:
    out_dir: str = opt("docs/rope", "the folder the four PNGs are written to")
    dim: int = opt(64, "d, the rotated dims of a head: d/2 pairs", check=HEAD)
    decay_dim: int = opt(128, "d of the decay figure: RoFormer draws its Figure 2 at 128", check=HEAD)
    base: float = opt(10000.0, "b in theta_i = b^(-2(i-1)/d)", check=("be > 1", lambda v: v > 1))
    original_len: int = opt(4096, "L0, the context trained at, which the scalings stretch", check=config.POSITIVE)
    factor: float = opt(
        4.0, "s, the scalings' factor: L0 is stretched to s * L0", check=config.AT_LEAST_1
    )  # 1: every scaling is plain RoPE

    def __post_init__(self):
        config.validate(self)

    def head(self, dim=None):
        return f"d = {dim or self.dim}, base {self.base:g}"

    @property
    def stretched(self):
        return round(self.factor * self.original_len)


def pyplot():
    install = 'pip install matplotlib (or pip install -e ".[plots]")'
    config.optional_package("matplotlib", "rope_figures.py", install).use("Agg")  # files only: no display needed
    return config.optional_package("matplotlib.pyplot", "rope_figures.py", install)


def save(plt, fig, path):
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    print(f"wrote {path}")


def turned_unit_vectors(dim, base, count):
    """(count, dim/2, 2): each pair's unit vector (1, 0) turned by rope.apply_rope at positions 0..count-1."""
    positions = torch.arange(count)
    cos, sin = rope.tables(rope.frequencies(dim, base), positions)
    ones = torch.zeros(count, dim)
    ones[:, 0::2] = 1.0  # every pair (x_2i, x_2i+1) = (1, 0)
    return rope.apply_rope(ones, cos, sin).unflatten(-1, (-1, 2))  # (T, d) -> (T, d/2, 2)


def draw_pairs(plt, settings, path):
    """A few pairs' unit vectors turning with position, each at its own frequency, and cos(m theta_i) for all."""
    pairs = sorted({round(j * (settings.dim // 2 - 1) / (SHOWN_PAIRS - 1)) for j in range(SHOWN_PAIRS)})
    theta = rope.frequencies(settings.dim, settings.base)
    circle = turned_unit_vectors(settings.dim, settings.base, CIRCLE_POSITIONS)
    colors = plt.cm.viridis(torch.linspace(0, 1, CIRCLE_POSITIONS).numpy())
    fig = plt.figure(figsize=(12, 6.5))
    grid = fig.add_gridspec(2, len(pairs), height_ratios=(1, 1.3))
    for column, pair in enumerate(pairs):
        ax = fig.add_subplot(grid[0, column], aspect="equal")
        ax.add_patch(plt.Circle((0, 0), 1, fill=False, color="0.8"))
        for m in range(CIRCLE_POSITIONS):
            ax.annotate("", circle[m, pair].tolist(), (0, 0), arrowprops={"arrowstyle": "->", "color": colors[m]})
        ax.set(xlim=(-1.2, 1.2), ylim=(-1.2, 1.2), xticks=[], yticks=[])
        ax.set_title(rf"pair {pair}: $\theta$ = {theta[pair].item():.3g}", fontsize="medium")
    fig.colorbar(plt.cm.ScalarMappable(plt.Normalize(0, CIRCLE_POSITIONS - 1), "viridis"), ax=ax, label="position m")
    heat = fig.add_subplot(grid[1, :])
    wave = turned_unit_vectors(settings.dim, settings.base, DECAY_DISTANCES)[..., 0].T  # (d/2, T): cos(m theta_i)
    image = heat.imshow(wave.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
    heat.set(xlabel="position m", ylabel="pair i", title=r"$\cos(m\theta_i)$: the first coordinate of each turned pair")
    fig.colorbar(image, ax=heat)
    fig.suptitle(rf"rope.apply_rope turns pair $i$ by $m\theta_i$ at position $m$ ({settings.head()})")
    save(plt, fig, path)


def draw_wavelengths(plt, settings, path):
    """Each pair's wavelength 2 pi / theta_i for plain RoPE and under every scaling of scalings.SCALINGS."""
    plain = rope.frequencies(settings.dim, settings.base)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    label, style = SCALING_LINES[scalings.NO_SCALING]
    ax.plot(2 * math.pi / plain, label=label, **style)  # where a scaling keeps a pair's frequency, it lies on this
    for name, scaling in scalings.SCALINGS.items():
        # dynamic NTK reads the current length: here the stretched context
        theta, _ = scalings.scaled_frequencies(
            settings.dim, settings.base, name, settings.factor, settings.original_len, settings.stretched
        )
        if torch.equal(theta, plain):  # plain RoPE itself, or a scaling that changes nothing at this factor
            continue
        label, style = SCALING_LINES[name]
        label += f" (at L = {settings.stretched})" if scaling.dynamic else ""
        ax.plot(2 * math.pi / theta, lw=1, label=label, **style)
        kept, slowed = torch.isclose(theta, plain).sum(), torch.isclose(theta, plain / settings.factor).sum()
        print(f"{label}: of {len(plain)} pairs, {kept} keep theta, {slowed} turn s times slower, the rest between")
    wavelengths = 2 * math.pi / plain
    longer = (wavelengths > settings.original_len).sum()
    print(f"plain RoPE: wavelengths {wavelengths[0]:.3g} to {wavelengths[-1]:.3g}, {longer} pairs longer than L0")
    ax.axhline(settings.original_len, color="k", ls="--", lw=1, label=f"L0 = {settings.original_len}")
    ax.axhline(settings.stretched, color="k", ls=":", lw=1, label=f"s L0 = {settings.stretched}")
    ax.set(yscale="log", xlabel="pair i", ylabel=r"wavelength $2\pi/\theta_i$ (positions)")
    ax.set_title(f"Wavelengths under each scaling at s = {settings.factor:g} ({settings.head()})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    save(plt, fig, path)


def decay_bound(dim, base, distances):
    """RoFormer's relative upper bound (section 3.4.3) at each distance r: (1/(d/2)) sum_{j=1}^{d/2} |S_j| with
    S_j = sum_{k=0}^{j-1} e^{i r theta_k}. At r = 0 every |S_j| = j, so it starts at (d/2 + 1)/2."""
    angles = distances.to(torch.float64)[:, None] * rope.frequencies(dim, base)  # (R, d/2)
    partial_sums = torch.polar(torch.ones_like(angles), angles).cumsum(-1)  # (R, d/2): S_1 .. S_{d/2}
    return partial_sums.abs().mean(-1)


def draw_decay(plt, settings, path):
    distances = torch.arange(DECAY_DISTANCES + 1)
    bound = decay_bound(settings.decay_dim, settings.base, distances)
    head = settings.head(settings.decay_dim)
    read = ", ".join(f"{bound[r]:.3g} at distance {r}" for r in DECAY_READ)
    print(f"decay bound ({head}): {read}, {bound.min():.3g} at its lowest up to {DECAY_DISTANCES}")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(distances, bound, lw=1)
    for r in DECAY_READ:
        ax.annotate(f"{bound[r]:.3g}", (r, bound[r]), xytext=(4, 6), textcoords="offset points")
    ax.plot(DECAY_READ, bound[list(DECAY_READ)], "o", color="C1", markersize=4)
    ax.set(xlabel="relative distance m - n", ylabel=r"relative upper bound $\frac{1}{d/2}\sum_{j=1}^{d/2}|S_j|$")
    ax.set_title(f"RoFormer's long-term decay, its Figure 2 ({head})")
    ax.grid(alpha=0.3)
    save(plt, fig, path)


def random_query_key(dim, seed=0):
    """(2, dim): a random q and k, the same for a seed."""
    return torch.randn(2, dim, generator=torch.Generator().manual_seed(seed))


def rotated_scores(q, k, base, positions):
    """(P, P): [m, n] is <R(m) q, R(n) k> through rope.apply_rope in float32, for m and n of positions."""
    dim = len(q)
    cos, sin = rope.tables(rope.frequencies(dim, base), positions)
    turned_q = rope.apply_rope(q.expand(len(positions), dim), cos, sin)  # (P, d): row m is R(m) q
    turned_k = rope.apply_rope(k.expand(len(positions), dim), cos, sin)
    return turned_q @ turned_k.T


def identity_scores(dim, base, positions, seed=0):
    """(scores <R(m) q, R(n) k> through rope.apply_rope in float32, float64 references q . R(n - m) k from
    rope.rotation_matrix, n - m), each (P*P,), for a random q and k and every (m, n) of positions."""
    q, k = random_query_key(dim, seed)
    scores = rotated_scores(q, k, base, positions).flatten()  # (P, P) -> (P*P,)
    gaps = (positions[None, :] - positions[:, None]).flatten()  # (P*P,): n - m
    reference = {g: q.double() @ rope.rotation_matrix(dim, g, base) @ k.double() for g in gaps.unique().tolist()}
    return scores, torch.stack([reference[g] for g in gaps.tolist()]), gaps


def draw_identity(plt, settings, path):
    """The scores <R(m) q, R(n) k> over (m, n), constant along each diagonal n - m, and against q . R(n - m) k at many
    (m, n): RoFormer eq. 16 checked; returns the max difference."""
    shuffled = torch.randperm(settings.stretched, generator=torch.Generator().manual_seed(0))
    positions = shuffled[:IDENTITY_POSITIONS]
    scores, reference, gaps = identity_scores(settings.dim, settings.base, positions)
    difference = scores.double() - reference
    largest = difference.abs().max().item()
    print(f"relative-position identity: max |apply_rope - rotation_matrix| = {largest:.3g}")
    fig, (heat, left, right) = plt.subplots(1, 3, figsize=(17, 5))
    grid = rotated_scores(*random_query_key(settings.dim), settings.base, torch.arange(IDENTITY_GRID))
    # a colour scale over the scores' own range, not centred on 0: a random q and k may score mostly of one sign
    image = heat.imshow(grid.numpy(), cmap="viridis", interpolation="nearest")
    heat.set(xlabel="key position n", ylabel="query position m")
    heat.set_title(r"$\langle R(m)q, R(n)k\rangle$: constant along each diagonal")
    fig.colorbar(image, ax=heat)
    left.plot(reference, scores, ".", markersize=3)
    left.set(xlabel="q . R(n - m) k (rotation_matrix, float64)", ylabel="<R(m) q, R(n) k> (apply_rope, float32)")
    left.set_title(f"{len(scores)} pairs (m, n) of {len(positions)} positions below s L0 = {settings.stretched}")
    right.plot(gaps, difference, ".", markersize=3)
    right.set(xlabel="n - m", ylabel="apply_rope - rotation_matrix")
    right.set_title(f"difference: at most {largest:.2g} in absolute value")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(f"The score depends on n - m alone ({settings.head()}, random q and k)")
    save(plt, fig, path)
    return largest


def draw_all(settings):
    """The four figures into settings.out_dir; returns the identity check's max |difference|."""
    plt = pyplot()
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    draw_pairs(plt, settings, out / "pairs.png")
    draw_wavelengths(plt, settings, out / "wavelengths.png")
    draw_decay(plt, settings, out / "decay.png")
    return draw_identity(plt, settings, out / "identity.png")


def main(argv=None):
    config.main(argv, __doc__, (FiguresConfig,), draw_all)


if __name__ == "__main__":
    main()
