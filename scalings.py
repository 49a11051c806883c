"""The deployed context-extension scalings of RoPE, each a transform of rope.py's frequencies, and their transformers
mapping.

A scaling by a factor s stretches a model trained on L0 positions to s * L0. Each is a formula
f(rot_dim, base, s, L0, L) -> (float64 theta', attn_factor) in the registry `SCALINGS`, under the name transformers
gives it, and reduces bitwise to plain RoPE at s = 1. `linear` (PI) and `ntk` are the two simple scalings, slower
rotations and another base (rope.slower, rope.ntk_base); `dynamic`, `yarn` and `llama3` treat fast and slow pairs
differently. positions.RoPE asks here once, where the model is built, and only where a scaling is set or p-RoPE drops
pairs; a plain RoPE run reads rope.py's theta_i alone.
"""

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

import rope


def _none(rot_dim, base, factor, original_len, seq_len):
    """Plain RoPE: theta_i."""
    return rope.frequencies(rot_dim, base), 1.0


def _linear(rot_dim, base, factor, original_len, seq_len):
    """Position interpolation (Chen et al. 2023): rope.slower."""
    return rope.slower(rope.frequencies(rot_dim, base), factor), 1.0


def _ntk(rot_dim, base, factor, original_len, seq_len):
    """NTK-aware: plain RoPE at rope.ntk_base."""
    return rope.frequencies(rot_dim, rope.ntk_base(rot_dim, base, factor)), 1.0


def _dynamic(rot_dim, base, factor, original_len, seq_len):
    """Dynamic NTK: `ntk` with a factor grown from the current length L = seq_len,
    s_L = s*L/L0 - (s-1), i.e. base' = base * s_L^(d/(d-2)) for L > L0. s_L = 1 at L = L0, so it
    joins plain RoPE continuously; plain for L <= L0, for seq_len None, and for s = 1 (which
    here means "off", whereas the formula alone would still grow the base past L0)."""
    if factor == 1 or seq_len is None or seq_len <= original_len:
        return _none(rot_dim, base, factor, original_len, seq_len)
    return _ntk(rot_dim, base, factor * seq_len / original_len - (factor - 1), original_len, seq_len)


def _blend(inv_freq, factor, weight):
    """theta' = theta * ((1 - weight)/s + weight): theta where weight = 1, theta/s where weight = 0, linear between.
    Written as theta times one multiplier because (1 - weight)/1 + weight is exactly 1.0 in floating point."""
    return inv_freq * ((1 - weight) / factor + weight)


def _turns_ramp(inv_freq, factor, original_len, slow, fast):
    """`_blend` with weight = clamp((r - slow)/(fast - slow), 0, 1), where r = L0 * theta / (2 pi) = L0 / wavelength
    counts a pair's turns within the trained context. Pairs turning >= fast times keep theta (training showed them
    every angle), pairs turning <= slow times get theta/s (they would meet unseen angles), linear in r between."""
    turns = original_len * inv_freq / (2 * math.pi)
    return _blend(inv_freq, factor, ((turns - slow) / (fast - slow)).clamp(0.0, 1.0))


def _pair_of_turns(turns, rot_dim, base, original_len):
    """D(n) = d ln(L0 / (2 pi n)) / (2 ln base): the (fractional) pair index i whose theta_i turns n times within
    L0, from L0 * base^(-2i/d) / (2 pi) = n."""
    return rot_dim * math.log(original_len / (2 * math.pi * turns)) / (2 * math.log(base))


def yarn_ramp(rot_dim, base, original_len, beta_fast=32.0, beta_slow=1.0):
    """(rot_dim//2,) float64 YaRN's blend per pair, 0 where theta is kept and 1 where it is interpolated to theta/s,
    as its authors' code and Hugging Face transformers deploy it: linear in the pair index i from low =
    floor(D(beta_fast)) to high = ceil(D(beta_slow)) (`_pair_of_turns`; clipped to [0, d - 1]), not in the turns r
    as the paper's text writes it (its alpha = 1 and beta = 32 are beta_slow and beta_fast here)."""
    low = max(math.floor(_pair_of_turns(beta_fast, rot_dim, base, original_len)), 0)
    high = min(math.ceil(_pair_of_turns(beta_slow, rot_dim, base, original_len)), rot_dim - 1)
    width = high - low if high != low else 0.001  # as deployed: one pair index then switches almost at once
    return ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / width).clamp(0.0, 1.0)


def _yarn(rot_dim, base, factor, original_len, seq_len, beta_fast=32.0, beta_slow=1.0):
    """YaRN (Peng et al. 2023): theta blended towards theta/s by `yarn_ramp`, plus an attention temperature
    sqrt(1/t) = 0.1 ln s + 1 that q and k each carry, so the softmax scale is multiplied by attn_factor =
    (0.1 ln s + 1)^2."""
    ramp = yarn_ramp(rot_dim, base, original_len, beta_fast, beta_slow)
    return _blend(rope.frequencies(rot_dim, base), factor, 1 - ramp), (0.1 * math.log(factor) + 1.0) ** 2


def _llama3(rot_dim, base, factor, original_len, seq_len, low_freq_factor=1.0, high_freq_factor=4.0):
    """Llama 3.1: by wavelength lambda = 2 pi / theta, keep theta for lambda < L0/high_freq_factor,
    use theta/s for lambda > L0/low_freq_factor, and between blend with
    smooth = (L0/lambda - low)/(high - low): that is `_turns_ramp` over r = L0/lambda from low to high,
    so it is continuous at both band edges."""
    return _turns_ramp(rope.frequencies(rot_dim, base), factor, original_len, low_freq_factor, high_freq_factor), 1.0


@dataclass(frozen=True)
class Scaling:
    """A context-extension scaling: its formula and everything else that its name stands for."""

    formula: Callable  # f(rot_dim, base, s, L0, L) -> (float64 theta', attn_factor), plain RoPE at s = 1
    dynamic: bool = False  # it reads the current length L: past L0 no fixed table serves
    rope_type: str | None = None  # transformers' name of it; None: it has none, and `new_base` says what it is
    new_base: Callable | None = None  # (rot_dim, base, s) -> the base of plain RoPE that it is, where it is one
    bands: tuple = ()  # the formula's band edges, which transformers reads under the same names
    tempered: bool = False  # it multiplies the softmax scale (attn_factor); transformers, the rotated dims' alone

    @property
    def needs_original_len(self):
        """Whether it reads L0, the length first trained: a dynamic scaling grows past it, band edges are turns
        in it."""
        return self.dynamic or bool(self.bands)

    def band_defaults(self):
        """{name: value} of the band edges, as the formula's defaults."""
        parameters = inspect.signature(self.formula).parameters
        return {name: parameters[name].default for name in self.bands}

    def hf_parameters(self, rot_dim, base, factor, original_len):
        """transformers' rope_type, rope_theta and the scaling's own parameters in its rope_parameters."""
        if self.new_base:
            return {"rope_type": SCALINGS[NO_SCALING].rope_type, "rope_theta": self.new_base(rot_dim, base, factor)}
        out = {"rope_type": self.rope_type, "rope_theta": base}
        if self is not SCALINGS[NO_SCALING]:
            out["factor"] = factor
        if self.bands:
            out |= {"original_max_position_embeddings": original_len, **self.band_defaults()}
        return out

    def hf_context(self, block_size, original_len, factor):
        """transformers' max_position_embeddings: the context the scaling stretches L0 to, except for a dynamic
        scaling, which transformers reads it as L0, where it starts growing the base."""
        return original_len if self.dynamic else max(block_size, round(original_len * factor))


# The scalings' names. Outside configs, docs and tests they are written here alone: code that means one of them
# takes its constant.
NO_SCALING = rope.NO_SCALING  # plain RoPE
LINEAR = "linear"  # Position Interpolation (PI)
NTK = "ntk"  # NTK-aware: plain RoPE of a larger base
DYNAMIC = "dynamic"  # Dynamic NTK: the base grows with the length past L0
YARN = "yarn"
LLAMA3 = "llama3"
SCALINGS = {
    NO_SCALING: Scaling(_none, rope_type="default"),
    LINEAR: Scaling(_linear, rope_type="linear"),
    NTK: Scaling(_ntk, new_base=rope.ntk_base),
    DYNAMIC: Scaling(_dynamic, dynamic=True, rope_type="dynamic"),
    YARN: Scaling(_yarn, rope_type="yarn", bands=("beta_fast", "beta_slow"), tempered=True),
    LLAMA3: Scaling(_llama3, rope_type="llama3", bands=("low_freq_factor", "high_freq_factor")),
}


def in_force(scaling, factor):
    """The scaling that acts: at factor 1 every scaling is plain RoPE (each formula reduces to it bitwise)."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {tuple(SCALINGS)}")
    return NO_SCALING if factor == 1 else scaling


def from_hf(params, max_len):
    """(base, scaling, factor, L0) of transformers' rope_parameters (rope_type, rope_theta, the scaling's own; its
    partial_rotary_factor is the caller's) and max_position_embeddings, or a ValueError naming what has no
    equivalent here. L0 is None where the scaling does not read it."""
    rope_type = params.get("rope_type", "default")
    name = next((n for n, s in SCALINGS.items() if s.rope_type == rope_type), None)
    if name is None:
        raise ValueError(
            f"rope_type={rope_type!r} has no nanorope scaling; supported: "
            + ", ".join(s.rope_type for s in SCALINGS.values() if s.rope_type)
        )
    scaling, bands = SCALINGS[name], SCALINGS[name].band_defaults()
    read = ("rope_type", "rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings")
    other = {k: v for k, v in params.items() if k not in read and v is not None and bands.get(k) != v}
    if other:
        raise ValueError(
            f"rope_type={rope_type!r} with "
            + ", ".join(f"{k}={v!r}" for k, v in other.items())
            + f": nanorope's {name} has "
            + (", ".join(f"{k}={v!r}" for k, v in bands.items()) or "no such parameter")
        )
    L0 = max_len if scaling.dynamic else params.get("original_max_position_embeddings") if scaling.bands else None
    return float(params["rope_theta"]), name, float(params.get("factor", 1.0)), L0


def scaling_pair(scaling, factor, stretch=None):
    """The one rule for a RoPE scaling and its factor s, wherever they are set: (scaling, factor), where a factor
    other than 1 (plain RoPE) needs a scaling, and a scaling without a factor takes `stretch` (the factor its use
    asks for), or is refused where there is none. scaling None or NO_SCALING: none."""
    if scaling not in (None, *SCALINGS):
        raise ValueError(f"rope_scaling={scaling!r} must be one of {', '.join(SCALINGS)}")
    if scaling in (None, NO_SCALING):
        if factor not in (None, 1):
            raise ValueError(
                f"rope_scaling_factor={factor:g} does nothing without a rope_scaling "
                f"({', '.join(s for s in SCALINGS if s != NO_SCALING)})"
            )
        return NO_SCALING, 1.0
    if factor is None and stretch is None:
        raise ValueError(f"rope_scaling={scaling!r} needs its factor: name it with --rope_scaling_factor")
    return scaling, stretch if factor is None else factor


def scaled_frequencies(rot_dim, base, scaling=NO_SCALING, factor=1.0, original_len=None, seq_len=None):
    """(inv_freq float64 (rot_dim//2,), attn_factor) for a context-extension `scaling` by `factor` s
    from a model trained on `original_len` L0 positions, at total length `seq_len` (dynamic only).
    attn_factor multiplies the attention softmax scale (1.0 except for yarn). Formulas: SCALINGS[name].formula."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {tuple(SCALINGS)}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor={factor!r} must be a finite number >= 1 (1 means no scaling)")
    if SCALINGS[scaling].needs_original_len and not (isinstance(original_len, int) and original_len > 0):
        raise ValueError(
            f"scaling={scaling!r} needs original_len (the trained context) as a positive int, got {original_len!r}"
        )
    return SCALINGS[scaling].formula(rot_dim, base, factor, original_len, seq_len)


def keep_highest(inv_freq: torch.Tensor, p: float) -> torch.Tensor:
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings
    useful?"): the highest round(p * d/2) frequencies kept and the rest set to 0, so the lowest-frequency
    pairs are not rotated at all and carry content alone. p = 1 is RoPE and p = 0 no rotation; unlike
    `fraction`, which leaves out trailing dims of the head, this leaves out the slowest frequencies."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p!r} must lie in [0, 1]: the fraction of RoPE's frequencies kept")
    kept = round(p * len(inv_freq))
    return torch.cat((inv_freq[:kept], inv_freq.new_zeros(len(inv_freq) - kept)))


def frequencies(rot_dim, base, scaling=NO_SCALING, factor=1.0, original_len=None, seq_len=None, p=1.0):
    """(theta float64, attn_factor) that positions.RoPE turns pairs by: the scaling's (`scaled_frequencies`),
    p-RoPE's share p of them kept (`keep_highest`)."""
    inv_freq, attn_factor = scaled_frequencies(rot_dim, base, scaling, factor, original_len, seq_len)
    return keep_highest(inv_freq, p), attn_factor


def of_model(config):
    """(theta', attention factor, at_length) of a model config's RoPE (GPTConfig), resolved once where the model is
    built: at_length is None, or for a dynamic scaling the function of the total length L that gives theta' there."""

    def at(seq_len=None):
        return frequencies(
            config.rotated_dims,
            config.rope_base,
            config.rope_scaling,
            config.rope_scaling_factor,
            config.L0,
            seq_len,
            config.rope_p,
        )

    inv_freq, attn_factor = at()
    return inv_freq, attn_factor, (lambda length: at(length)[0]) if scaling_of(config).dynamic else None


def in_force_scaling(scaling, factor):
    """The Scaling that acts for a scaling name and its factor: plain RoPE's entry where the factor is 1."""
    return SCALINGS[in_force(scaling, factor)]


def scaling_of(config):
    """The Scaling in force in a model config (GPTConfig)."""
    return in_force_scaling(config.rope_scaling, config.rope_scaling_factor)


def is_scaled(config):
    """Whether a RoPE scaling changes anything in a model config."""
    return scaling_of(config) is not SCALINGS[NO_SCALING]
