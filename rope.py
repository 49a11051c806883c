"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer", section 3.4): RoPE's maths and nothing else.

A head's d dims are cut into d/2 pairs. At position m, pair i is turned by the angle m * theta_i, a slower turn
for each later pair, theta_i = base^(-2(i-1)/d) (eq. 15). Queries and keys are turned, never values, so the score
of a query at m and a key at n depends on m - n alone (eq. 16). Attention calls positions.RoPE.rotate, which calls
`apply_rope` below; scalings.py's scalings (YaRN, dynamic NTK, Llama 3) are resolved to frequencies where the model
is built. Which code runs: compiled (a default GPU run) and in the half layout, the pair formula of `rotate_pairs`;
eager in the interleaved layout (a default CPU run), the same numbers as one complex product per pair,
(a + ib)(cos + i sin), in `_ComplexPairs`, one kernel each way (bench.py's train_step gives its share of a step).

Conventions:
* Sign. Each pair (a, b) is multiplied by RoFormer's R(m) = [[cos, -sin], [sin, cos]] (eq. 15):
  (a, b) -> (a cos - b sin, a sin + b cos), the vector turned counter-clockwise by m*theta. Texts that turn the
  axes instead use the transpose (angle -m*theta); scores depend only on m - n either way, but checkpoints differ.
* Layouts. "interleaved" pairs (x0, x1), (x2, x3), ... as the paper; "half" pairs (x_i, x_{i + d/2}) as GPT-NeoX
  and LLaMA checkpoints; `half_to_interleaved` maps one onto the other.
* Precision. The angles m * theta are computed in float64 (on the CPU where a device has none), the cos/sin tables
  kept and the rotation done in (at least) float32 whatever the model's dtype, and the result cast back once: a
  bf16 angle cannot tell position 256 from 257, and float32 angles near position 4096 are 4.9e-4 apart.
"""

import torch

LAYOUTS = ("interleaved", "half")
NO_SCALING = "none"  # the rope_scaling of plain RoPE; the deployed scalings, read only where a run names one


def frequencies(rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """(rot_dim/2,) float64 theta_i = base^(-2(i-1)/d) for i = 1..d/2 (RoFormer eq. 15)."""
    if not (isinstance(rot_dim, int) and rot_dim > 0 and rot_dim % 2 == 0):
        raise ValueError(f"rot_dim={rot_dim!r} must be a positive even int: dims rotate in pairs")
    if not base > 1:
        raise ValueError(f"base={base!r} must be > 1 so that frequencies fall from 1")
    return base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)


def tables(inv_freq: torch.Tensor, positions: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin float32 (T, rot_dim/2) on device (default positions') for integer `positions` (T,). The angles
    m * theta are computed in float64 (on the CPU for MPS, which has none), so with float64 frequencies each entry
    is the exact angle's cos or sin rounded once to float32, at any position below 2^53."""
    if positions.is_floating_point():
        raise ValueError(f"positions must be integers, got {positions.dtype}: low-precision floats merge neighbours")
    device = positions.device if device is None else torch.device(device)
    work = torch.device("cpu") if device.type == "mps" else device
    angles = positions.to(work, torch.float64)[..., None] * inv_freq.to(work, torch.float64)  # (..., T, rot/2)
    return angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Each pair (a, b) of x (..., T, d) turned by R(m): (a cos - b sin, a sin + b cos), cos and sin (T, d/2)."""
    if layout == "interleaved":
        a, b = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., T, d/2) each: the pairs (x_2i, x_2i+1)
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (..., T, d)
    a, b = x.chunk(2, dim=-1)  # (..., T, d/2) each: the pairs (x_i, x_i+d/2)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (..., T, d)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] dims of x (..., T, hs) by R(m) per pair; the rest pass through bit-identically
    (partial rotary). cos, sin (T, rot/2) broadcast over the leading dims. Computes in at least float32 and casts back
    to x.dtype once; x is never modified."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    rot, hs = 2 * cos.shape[-1], x.shape[-1]
    if rot > hs:
        raise ValueError(f"tables rotate {rot} dims but x has only hs={hs}")
    if rot < hs:  # partial rotary: the tail passes through as x's own values, never via float32
        return torch.cat((apply_rope(x[..., :rot], cos, sin, layout), x[..., rot:]), dim=-1)  # (..., T, hs)
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # no copy for float32
    if layout == "interleaved" and not torch.compiler.is_compiling():
        cis = torch.complex(cos, sin)  # (T, rot/2): e^{i m theta}, the same numbers, faster in eager (bench.py)
        if torch.is_grad_enabled() and (x32.requires_grad or cis.requires_grad):
            out = _ComplexPairs.apply(x32, cis)  # (..., T, hs)
        else:  # no graph to record: the Function's call costs as much as one token's rotation
            out = _ComplexPairs.turn(_as_complex(x32), cis)  # (..., T, hs)
    else:  # compiled, inductor fuses the pair formula into the kernels around it
        out = rotate_pairs(x32, cos, sin, layout)
    return out.to(x.dtype)


def _as_complex(x):
    """(..., rot) real -> (..., rot/2) complex a + ib of its pairs (a, b): a view where strides allow, else a copy."""
    x = x.unflatten(-1, (-1, 2))  # (..., rot/2, 2)
    viewable = x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])
    return torch.view_as_complex(x if viewable else x.contiguous())


class _ComplexPairs(torch.autograd.Function):
    """`rotate_pairs` in the interleaved layout as one complex product, (a + ib)(cos + i sin) = (a cos - b sin) +
    i(a sin + b cos): one kernel each way where the pair formula on stride-2 views takes several. Its backward is one
    product by the conjugate, R(m)^T; the tables get a gradient only where a test asks for one."""

    @staticmethod
    def turn(pairs, cis):
        return torch.view_as_real(pairs * cis).flatten(-2)  # (..., T, rot/2, 2) -> (..., T, rot)

    @staticmethod
    def forward(ctx, x, cis):
        pairs = _as_complex(x)  # (..., T, rot/2)
        ctx.save_for_backward(cis, pairs if ctx.needs_input_grad[1] else None)
        return _ComplexPairs.turn(pairs, cis)

    @staticmethod
    def backward(ctx, grad):
        cis, pairs = ctx.saved_tensors
        grad_pairs = _as_complex(grad)  # (..., T, rot/2)
        grad_x = _ComplexPairs.turn(grad_pairs, cis.conj()) if ctx.needs_input_grad[0] else None
        grad_cis = (grad_pairs * pairs.conj()).sum_to_size(cis.shape) if ctx.needs_input_grad[1] else None
        return grad_x, grad_cis


def rotation_matrix(d: int, m: float, base: float = 10000.0, inv_freq=None) -> torch.Tensor:
    """The explicit (d, d) float64 block-diagonal R^d_{Theta,m} of RoFormer eq. 15, for teaching and tests.
    `inv_freq` overrides the frequencies; with fewer than d/2 of them the trailing dims get the identity."""
    theta = frequencies(d, base) if inv_freq is None else inv_freq.to(torch.float64)
    if 2 * len(theta) > d:
        raise ValueError(f"{len(theta)} frequencies rotate {2 * len(theta)} dims, more than d={d}")
    c, s = (m * theta).cos(), (m * theta).sin()
    i = torch.arange(0, 2 * len(theta), 2)
    R = torch.eye(d, dtype=torch.float64)
    R[i, i], R[i, i + 1], R[i + 1, i], R[i + 1, i + 1] = c, -s, s, c
    return R


def half_to_interleaved(d: int) -> torch.Tensor:
    """Permutation perm (d,) with x_half[..., perm] in the interleaved layout: half-layout pair i = (x_i, x_{i+d/2})
    lands on dims (2i, 2i+1). So apply_rope(x, c, s, "half")[..., perm] == apply_rope(x[..., perm], c, s), and with
    P = I[perm] the half layout's matrix is P^T R(m) P; perm.argsort() maps back."""
    if not (isinstance(d, int) and d > 0 and d % 2 == 0):
        raise ValueError(f"d={d!r} must be a positive even int")
    i = torch.arange(d // 2)
    return torch.stack((i, i + d // 2), dim=-1).flatten()  # (d/2, 2) -> (d,): [0, d/2, 1, d/2+1, ...]


# The two simple scalings, two ways to fit a longer context into the angles training saw: slower rotations and
# another base.


def slower(inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
    """Every pair turned factor times slower, theta_i / s: position s*p gets plain RoPE's angle at p (Position
    Interpolation, Chen et al. 2023)."""
    return inv_freq / factor


def ntk_base(rot_dim: int, base: float, factor: float) -> float:
    """Another base, base * s^(d/(d-2)) (NTK-aware scaling): theta_1 = 1 is kept while the slowest pair's frequency
    becomes theta_{d/2} / s, so the fast pairs (local order) turn as trained and the slowest are interpolated."""
    if rot_dim <= 2:
        raise ValueError(f"rot_dim={rot_dim} must be > 2 for NTK scaling (exponent d/(d-2))")
    return base * factor ** (rot_dim / (rot_dim - 2))
