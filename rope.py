"""Rotary position embeddings (RoPE, Su et al. RoFormer): RoPE's maths and nothing else.

Frequencies and their context-extension scalings, the cos/sin tables, the rotation in both
layouts (partial rotary included) and the explicit matrix R(d, m) for teaching and tests. The
scheme that puts it in the model is positions.RoPE; this file knows nothing of the model. Conventions:

* Sign. Each pair (a, b) is multiplied by RoFormer's R(m) = [[cos, -sin], [sin, cos]] (eq. 15):
  (a, b) -> (a cos - b sin, a sin + b cos), the vector turned counter-clockwise by m*theta.
  Texts that turn the axes instead use the transpose (angle -m*theta); attention scores
  depend only on m - n either way, but checkpoints are not interchangeable.
* Layouts. "interleaved" pairs (x0, x1), (x2, x3), ... as the paper; "half" pairs
  (x_i, x_{i + r/2}) as GPT-NeoX and LLaMA checkpoints; `half_to_interleaved` maps one onto the other.
* Precision. Frequencies and the angles m * theta are computed in float64 (on the CPU, where every
  backend has it), the cos/sin tables kept and the rotation done in (at least) float32 whatever the
  model's dtype, and the result is cast back once: a bf16 angle cannot tell position 256 from 257, and a
  float32 angle at position 4096 is already off by ~5e-4.
"""

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LAYOUTS = ("interleaved", "half")


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")


def _inv_freq64(rot_dim, base):
    """theta_i = base^(-2(i-1)/d), i = 1..d/2 (RoFormer eq. 15), in float64."""
    if not (isinstance(rot_dim, int) and rot_dim > 0 and rot_dim % 2 == 0):
        raise ValueError(f"rot_dim={rot_dim!r} must be a positive even int: dims rotate in pairs")
    if not base > 1:
        raise ValueError(f"base={base!r} must be > 1 so that frequencies fall from 1")
    return base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)


def rope_frequencies(rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """(rot_dim//2,) float64 inverse frequencies theta_i = base^(-2(i-1)/rot_dim)."""
    return _inv_freq64(rot_dim, base)


# ---- context-extension scalings: f(rot_dim, base, s, L0, L) -> (float64 theta', attn_factor) ----
# Each reduces bitwise to plain RoPE at s = 1; `scaled_frequencies` is the checked entry point.


def _none(rot_dim, base, factor, original_len, seq_len):
    """Plain RoPE: theta_i."""
    return _inv_freq64(rot_dim, base), 1.0


def _linear(rot_dim, base, factor, original_len, seq_len):
    """Position interpolation (Chen et al. 2023): theta_i' = theta_i / s, so the angle at
    position s*p equals plain RoPE's at p."""
    return _inv_freq64(rot_dim, base) / factor, 1.0


def ntk_base(rot_dim, base, factor):
    """NTK-aware scaling's new base, base' = base * s^(d/(d-2)). Then theta_1 = 1 is kept (exponent 0) and the
    lowest frequency base'^(-(d-2)/d) = theta_{d/2} / s: fast pairs (local order) are untouched while the slowest
    are interpolated like `linear`."""
    if rot_dim <= 2:
        raise ValueError(f"rot_dim={rot_dim} must be > 2 for NTK scaling (exponent d/(d-2))")
    return base * factor ** (rot_dim / (rot_dim - 2))


def _ntk(rot_dim, base, factor, original_len, seq_len):
    """NTK-aware: plain RoPE at `ntk_base`."""
    return _inv_freq64(rot_dim, ntk_base(rot_dim, base, factor)), 1.0


def _dynamic(rot_dim, base, factor, original_len, seq_len):
    """Dynamic NTK: `ntk` with a factor grown from the current length L = seq_len,
    s_L = s*L/L0 - (s-1), i.e. base' = base * s_L^(d/(d-2)) for L > L0. s_L = 1 at L = L0, so it
    joins plain RoPE continuously; plain for L <= L0, for seq_len None, and for s = 1 (which
    here means "off", whereas the formula alone would still grow the base past L0)."""
    if factor == 1 or seq_len is None or seq_len <= original_len:
        return _none(rot_dim, base, factor, original_len, seq_len)
    return _ntk(rot_dim, base, factor * seq_len / original_len - (factor - 1), original_len, seq_len)


def _blend(inv_freq, factor, keep):
    """theta' = theta * ((1 - keep)/s + keep): theta where keep = 1, theta/s where keep = 0, linear between.
    Written as theta times one multiplier because (1 - keep)/1 + keep is exactly 1.0 in floating point."""
    return inv_freq * ((1 - keep) / factor + keep)


def _turns_ramp(inv_freq, factor, original_len, slow, fast):
    """`_blend` with keep = clamp((r - slow)/(fast - slow), 0, 1), where r = L0 * theta / (2 pi) = L0 / wavelength
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
    return _blend(_inv_freq64(rot_dim, base), factor, 1 - ramp), (0.1 * math.log(factor) + 1.0) ** 2


def _llama3(rot_dim, base, factor, original_len, seq_len, low_freq_factor=1.0, high_freq_factor=4.0):
    """Llama 3.1: by wavelength lambda = 2 pi / theta, keep theta for lambda < L0/high_freq_factor,
    use theta/s for lambda > L0/low_freq_factor, and between blend with
    smooth = (L0/lambda - low)/(high - low): that is `_turns_ramp` over r = L0/lambda from low to high,
    so it is continuous at both band edges."""
    return _turns_ramp(_inv_freq64(rot_dim, base), factor, original_len, low_freq_factor, high_freq_factor), 1.0


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
NO_SCALING = "none"  # plain RoPE
LINEAR = "linear"  # Position Interpolation (PI)
NTK = "ntk"  # NTK-aware: plain RoPE of a larger base
DYNAMIC = "dynamic"  # Dynamic NTK: the base grows with the length past L0
YARN = "yarn"
LLAMA3 = "llama3"
SCALINGS = {
    NO_SCALING: Scaling(_none, rope_type="default"),
    LINEAR: Scaling(_linear, rope_type="linear"),
    NTK: Scaling(_ntk, new_base=ntk_base),
    DYNAMIC: Scaling(_dynamic, dynamic=True, rope_type="dynamic"),
    YARN: Scaling(_yarn, rope_type="yarn", bands=("beta_fast", "beta_slow"), tempered=True),
    LLAMA3: Scaling(_llama3, rope_type="llama3", bands=("low_freq_factor", "high_freq_factor")),
}


def in_force(scaling, factor):
    """The scaling that acts: at factor 1 every scaling is plain RoPE (each formula reduces to it bitwise)."""
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


def rope_cache(inv_freq: torch.Tensor, positions: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin float32 (T, rot_dim//2) on device (default positions') for integer `positions` (T,). The angles
    m * theta are computed in float64 (on the CPU for MPS, which has none), so with float64 frequencies each table
    entry is the exact angle's cos/sin rounded once to float32, at any position below 2^53."""
    if positions.is_floating_point():
        raise ValueError(
            f"positions must be integers, got dtype {positions.dtype}: "
            f"low-precision floats merge neighbouring positions"
        )
    device = positions.device if device is None else torch.device(device)
    work = torch.device("cpu") if device.type == "mps" else device
    angles = positions.to(work, torch.float64)[..., None] * inv_freq.to(work, torch.float64)  # (..., T, rot/2)
    return angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)


def _complex_pairs(x):
    """(..., rot) real -> (..., rot/2) complex a + ib of the pairs (a, b): a view when the memory
    layout allows (a transposed q or k does), else a copy."""
    x = x.unflatten(-1, (-1, 2))  # (..., rot/2, 2)
    viewable = x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])
    return torch.view_as_complex(x if viewable else x.contiguous())


def _turn(xz, cis):
    """Pairs xz (..., T, hs/2) as complex numbers times cis (T, hs/2), back to real (..., T, hs)."""
    return torch.view_as_real(xz * cis).flatten(-2)  # (..., T, hs/2, 2) -> (..., T, hs)


class _TurnPairs(torch.autograd.Function):
    """x (..., T, hs) with its pairs as complex numbers, times cis = e^{i m theta} (T, hs/2).

    Autograd would get the same gradients through view_as_complex, mul and view_as_real, but with
    a kernel or a copy at each step; here the backward is one multiplication by conj(cis), R(m)^T."""

    @staticmethod
    def forward(ctx, x, cis):
        xz = _complex_pairs(x)  # (..., T, hs/2)
        ctx.save_for_backward(cis, xz if ctx.needs_input_grad[1] else None)
        return _turn(xz, cis)

    @staticmethod
    def backward(ctx, grad):
        cis, xz = ctx.saved_tensors
        gz = _complex_pairs(grad)  # (..., T, hs/2)
        grad_x = _turn(gz, cis.conj()) if ctx.needs_input_grad[0] else None
        grad_cis = None
        if ctx.needs_input_grad[1]:  # the tables only need gradients in tests: summed over the broadcast dims
            grad_cis = (gz * xz.conj()).sum_to_size(cis.shape)
        return grad_x, grad_cis


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] dims of x (..., T, hs) by R(m) per pair; the rest pass
    through bit-identically. cos, sin (T, rot/2) broadcast over the leading dims. Computes in
    at least float32 and casts back to x.dtype once; x is never modified."""
    _check_layout(layout)
    half, hs = cos.shape[-1], x.shape[-1]
    rot = 2 * half
    if rot > hs:
        raise ValueError(f"tables rotate {rot} dims but x has only hs={hs}")
    if rot < hs:  # partial rotary: the tail passes through as x's own values, never via float32
        return torch.cat((apply_rope(x[..., :rot], cos, sin, layout), x[..., rot:]), dim=-1)  # (..., T, hs)
    xr = x.to(torch.promote_types(x.dtype, torch.float32))  # no copy for float32
    if layout == "interleaved" and torch.compiler.is_compiling():
        # the same R(m) in real arithmetic, which inductor fuses into the kernels around it; it has no
        # complex kernels, and the complex form below would run as separate unfused calls
        a, b = xr.unflatten(-1, (-1, 2)).unbind(-1)  # (..., T, rot/2) each
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (..., T, hs)
    elif layout == "interleaved":
        # Pair (a, b) as a + ib times e^{i m theta} = cos + i sin is (a cos - b sin) + i(a sin + b cos):
        # R(m) in one kernel each way; real arithmetic on stride-2 views is several times slower in eager.
        cis = torch.complex(cos, sin)  # (T, rot/2)
        if torch.is_grad_enabled() and (xr.requires_grad or cis.requires_grad):
            out = _TurnPairs.apply(xr, cis)  # (..., T, hs)
        else:  # no graph to record: skip the Function's call overhead, as large as the rotation for one token
            out = _turn(_complex_pairs(xr), cis)  # (..., T, hs)
    else:
        # rolling by hs/2 brings each partner under its pair-mate: x_{i+hs/2} under x_i and back
        out = xr * torch.cat((cos, cos), -1) + xr.roll(half, -1) * torch.cat((-sin, sin), -1)  # (..., T, hs)
    return out.to(x.dtype)


def rotation_matrix(d: int, m: float, base: float = 10000.0, inv_freq=None) -> torch.Tensor:
    """The explicit (d, d) float64 block-diagonal R^d_{Theta,m} of RoFormer eq. 15, for teaching
    and tests. `inv_freq` overrides the frequencies; with fewer than d/2 of them the trailing
    dims get the identity (partial rotary)."""
    theta = _inv_freq64(d, base) if inv_freq is None else inv_freq.to(torch.float64)
    if 2 * len(theta) > d:
        raise ValueError(f"{len(theta)} frequencies rotate {2 * len(theta)} dims, more than d={d}")
    c, s = (m * theta).cos(), (m * theta).sin()
    i = torch.arange(0, 2 * len(theta), 2)
    R = torch.eye(d, dtype=torch.float64)
    R[i, i], R[i, i + 1], R[i + 1, i], R[i + 1, i + 1] = c, -s, s, c
    return R


def half_to_interleaved(d: int) -> torch.Tensor:
    """Permutation perm (d,) with x_half[..., perm] in the interleaved layout: half-layout pair
    i = (x_i, x_{i+d/2}) lands on dims (2i, 2i+1). Hence
    apply_rope(x, c, s, "half")[..., perm] == apply_rope(x[..., perm], c, s, "interleaved"),
    and with P = I[perm] (so P @ x == x[perm]) the half layout's matrix is P^T R(m) P.
    perm.argsort() maps back."""
    if not (isinstance(d, int) and d > 0 and d % 2 == 0):
        raise ValueError(f"d={d!r} must be a positive even int")
    i = torch.arange(d // 2)
    return torch.stack((i, i + d // 2), dim=-1).flatten()  # (d/2, 2) -> (d,): [0, d/2, 1, d/2+1, ...]


class Rotary(torch.nn.Module):
    """RoPE for attention heads: owns the frequencies and float32 cos/sin tables for positions
    [0, max_len) and rotates q or k. The tables are non-persistent buffers: derived from the
    config, they follow the module across devices but stay out of checkpoints."""

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        fraction: float = 1.0,
        layout: str = "interleaved",
        scaling: str = NO_SCALING,
        factor: float = 1.0,
        original_len: int = 256,
        max_len: int = 256,
        keep: float = 1.0,
    ):
        super().__init__()
        rot_dim = int(head_dim * fraction)
        if not (0 < rot_dim <= head_dim and rot_dim % 2 == 0):
            raise ValueError(
                f"head_dim={head_dim} * fraction={fraction} gives rot_dim={rot_dim}; "
                f"it must be even and in [2, {head_dim}]"
            )
        _check_layout(layout)
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be >= 1")
        self.head_dim, self.rot_dim, self.base, self.layout = head_dim, rot_dim, base, layout
        self.scaling, self.factor, self.original_len, self.keep = scaling, factor, original_len, keep
        self._build(max_len, device=None)  # first: it refuses an unknown scaling with a ValueError naming them
        # past L0 a dynamic scaling in force has no fixed table (GPTConfig.scaling, and generate.py's static cache,
        # read the same rule)
        self.dynamic = SCALINGS[in_force(scaling, factor)].dynamic

    def extra_repr(self):
        return (
            f"head_dim={self.head_dim}, rot_dim={self.rot_dim}, base={self.base}, layout={self.layout!r}, "
            f"scaling={self.scaling!r}, factor={self.factor}, original_len={self.original_len}, keep={self.keep}"
        )

    def frequencies(self, seq_len=None):
        """(inv_freq, attn_factor): the scaling's frequencies (at total length seq_len for dynamic), the kept ones."""
        inv_freq, attn_factor = scaled_frequencies(
            self.rot_dim, self.base, self.scaling, self.factor, self.original_len, seq_len
        )
        return keep_highest(inv_freq, self.keep), attn_factor

    def _build(self, n, device):
        """(Re)build the float64 frequencies (kept on the CPU as a plain attribute, not a buffer: MPS has no float64)
        and the float32 cos/sin tables for positions [0, n) on device."""
        self.inv_freq, self.attn_factor = self.frequencies()
        # a table grown during generation (inference mode) must still serve training afterwards
        with torch.inference_mode(False):
            cos, sin = rope_cache(self.inv_freq, torch.arange(n), device)  # (n, rot/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) or .half() would round the tables (bf16 cannot tell position 256 from
        # 257); rebuild them in float32 wherever the buffers went instead of casting rounded values back.
        super()._apply(fn, recurse)
        self._build(self.cos.shape[0], self.cos.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, end: int | None = None) -> torch.Tensor:
        """Rotate x (..., T, hs), e.g. q and k stacked (2, B, H, T, hs), as the integer positions (T,) (default
        0..T-1), or each row's (B, T), which all lie below end: an int known on the host (a static decoding step's
        positions are not) that the tables must reach, and dynamic scaling's current length."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has hs={x.shape[-1]} but this Rotary was built for head_dim={self.head_dim}")
        if positions is None:
            positions, end = torch.arange(x.shape[-2], device=x.device), x.shape[-2]
        if self.dynamic and end > self.original_len:
            # The frequencies depend on the total length, so no fixed table serves: compute the T
            # rows needed. Keys already in a KV cache keep the frequencies they were rotated with.
            cos, sin = rope_cache(self.frequencies(seq_len=end)[0], positions)  # (T, rot/2)
        else:
            self.reserve(end)
            cos, sin = self.cos[positions], self.sin[positions]  # (T, rot/2) or (B, T, rot/2)
        if positions.dim() == 2:  # each row's own positions: broadcast over the heads
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, rot/2)
        return apply_rope(x, cos, sin, self.layout)

    def reserve(self, n):
        """Make the tables cover positions [0, n); call it before compiled code reaches position n - 1."""
        if n <= self.cos.shape[0]:
            return
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"position {n - 1} is past the rotary table ({self.cos.shape[0]} positions) "
                f"inside a compiled region, where it cannot be rebuilt: "
                f"call reserve({n}) first or build Rotary with max_len >= {n}"
            )
        # doubling keeps rebuilds logarithmic when a KV cache grows one token at a time
        self._build(max(n, 2 * self.cos.shape[0]), self.cos.device)
