"""Tests for rope.py: RoPE's maths against the paper's explicit matrices or an
independent float64 computation. Each test pins a property that a plausible bug would break."""

import ast
import functools
import math
import re

import pytest
import torch

import positions
import rope
import scalings
from conftest import ROOT
from model import GPTConfig
from spans import Span

L0 = 256  # the "trained" context used throughout


def tables(d, positions, base=10000.0):
    return rope.tables(rope.frequencies(d, base), torch.as_tensor(positions))


def rope_scheme(
    head_dim, fraction=1.0, layout="interleaved", scaling="none", factor=1.0, original_len=None, block_size=L0
):
    """positions.RoPE of a one-head model whose heads have head_dim dims, its tables built for block_size positions."""
    config = GPTConfig(
        n_embd=head_dim,
        n_head=1,
        block_size=block_size,
        original_len=original_len,
        rope_fraction=fraction,
        rope_layout=layout,
        rope_scaling=scaling,
        rope_scaling_factor=factor,
    )
    return positions.RoPE(config)


def shifted(r, x, start=0):
    """RoPE r applied to x (..., T, hs) at positions start..start+T-1, as attention applies it."""
    T = x.shape[-2]
    return r.rotate(x, Span(start, T, T, x.device), layer=0)


def reference(x, positions, inv_freq):
    """float64 R(m) @ x for each position m along dim -2, with the explicit matrix of eq. 15."""
    d = x.shape[-1]
    R = torch.stack([rope.rotation_matrix(d, float(m), inv_freq=inv_freq) for m in positions])  # (T, d, d)
    return torch.einsum("tij,...tj->...ti", R, x.double())


# ---- the explicit matrix ----------------------------------------------------------------------


def test_rotation_matrix_is_identity_at_zero():
    assert torch.equal(rope.rotation_matrix(16, 0.0), torch.eye(16, dtype=torch.float64))


@pytest.mark.parametrize("a,b", [(3.7, -11.2), (1000.0, 25.0), (-4.0, 4.0)])
def test_rotation_matrix_composes(a, b):
    R = functools.partial(rope.rotation_matrix, 16)  # R(m), the paper's notation
    torch.testing.assert_close(R(a) @ R(b), R(a + b), atol=1e-10, rtol=0)


def test_rotation_matrix_is_orthogonal_with_det_one():
    R = rope.rotation_matrix(32, 123.0)
    torch.testing.assert_close(R @ R.T, torch.eye(32, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.linalg.det(R).item() == pytest.approx(1.0, abs=1e-12)


def test_sign_is_papers_counter_clockwise_rotation():
    # R(m) = [[cos, -sin], [sin, cos]]: e_0 at position 1 (theta_1 = 1) turns to (cos 1, +sin 1);
    # the axes-rotation form of some tutorials is the transpose and would give (cos 1, -sin 1).
    R = rope.rotation_matrix(2, 1.0)
    assert R[0, 1].item() == -math.sin(1.0) and R[1, 0].item() == math.sin(1.0)
    cos, sin = tables(2, [1])
    for layout in rope.LAYOUTS:
        y = rope.apply_rope(torch.tensor([[1.0, 0.0]]), cos, sin, layout)
        torch.testing.assert_close(y, torch.tensor([[math.cos(1.0), math.sin(1.0)]]))


# ---- apply_rope against the matrix ------------------------------------------------------------


def test_interleaved_equals_rotation_matrix_for_a_batch_of_positions():
    torch.manual_seed(0)
    positions = torch.randint(0, 1000, (12,))
    x = torch.randn(2, 3, 12, 32)
    inv_freq = rope.frequencies(32)
    y = rope.apply_rope(x, *rope.tables(inv_freq, positions), layout="interleaved")
    torch.testing.assert_close(y.double(), reference(x, positions, inv_freq), atol=2e-4, rtol=0)


def test_half_to_interleaved_permutation_is_explicit():
    assert rope.half_to_interleaved(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_half_layout_is_the_permuted_matrix_and_keeps_scores():
    torch.manual_seed(1)
    d, positions = 16, torch.tensor([0, 5, 77, 400])
    perm = rope.half_to_interleaved(d)
    P = torch.eye(d, dtype=torch.float64)[perm]  # P @ v == v[perm]
    inv_freq = rope.frequencies(d)
    cos, sin = rope.tables(inv_freq, positions)
    q, k = torch.randn(2, 4, d)
    qh, kh = (rope.apply_rope(v, cos, sin, "half") for v in (q, k))
    for t, m in enumerate(positions.tolist()):
        R = rope.rotation_matrix(d, float(m), inv_freq=inv_freq)
        torch.testing.assert_close(qh[t].double(), P.T @ R @ P @ q[t].double(), atol=1e-4, rtol=0)
    # permuting into the interleaved layout commutes with rotating, so every q.k score is unchanged
    torch.testing.assert_close(qh[:, perm], rope.apply_rope(q[:, perm], cos, sin, "interleaved"), atol=1e-5, rtol=0)
    qi, ki = (rope.apply_rope(v[:, perm], cos, sin, "interleaved") for v in (q, k))
    torch.testing.assert_close(qh @ kh.T, qi @ ki.T, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_apply_rope_preserves_norms_and_does_not_touch_input(layout):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 50, 64)
    x0 = x.clone()
    y = rope.apply_rope(x, *tables(64, torch.arange(1000, 1050)), layout=layout)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=0)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_scores_depend_only_on_relative_position(layout):
    torch.manual_seed(3)
    q, k = torch.randn(2, 1, 64)
    inv_freq = rope.frequencies(64)

    def score(m, n):
        qm = rope.apply_rope(q, *rope.tables(inv_freq, torch.tensor([m])), layout=layout)
        kn = rope.apply_rope(k, *rope.tables(inv_freq, torch.tensor([n])), layout=layout)
        return (qm * kn).sum().item()

    same_gap = [score(m, m - 7) for m in (7, 20, 300, 1500)]
    assert max(same_gap) - min(same_gap) < 1e-3 * abs(same_gap[0]) + 1e-4
    assert min(abs(score(300, 300 - g) - same_gap[0]) for g in (0, 1, 6, 8, 50)) > 1e-2


# ---- frequencies and scalings -----------------------------------------------------------------


def test_frequencies_are_pinned():
    d, base = 64, 10000.0
    f = rope.frequencies(d, base)
    assert f.dtype == torch.float64 and f.shape == (d // 2,)
    assert f[0].item() == 1.0
    assert f[-1].item() == pytest.approx(base ** (-(d - 2) / d), rel=1e-14)
    expected = [base ** (-2 * (i - 1) / d) for i in range(1, d // 2 + 1)]  # eq. 15, i = 1..d/2
    torch.testing.assert_close(f, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


@pytest.mark.parametrize("position", [4096, 65536, 1_000_003])
def test_tables_are_the_exact_angles_rounded_once_to_float32(position):
    d, base = 64, 10000.0
    cos, sin = rope.tables(rope.frequencies(d, base), torch.tensor([position]))
    assert cos.dtype == sin.dtype == torch.float32
    angles = [position * base ** (-2 * i / d) for i in range(d // 2)]  # Python floats: float64 throughout
    for got, exact in ((cos, map(math.cos, angles)), (sin, map(math.sin, angles))):
        exact = torch.tensor(list(exact), dtype=torch.float64)
        # within half a float32 ulp of values below 1 (2^-25), plus the float64 angle's own rounding
        torch.testing.assert_close(got[0].double(), exact, atol=2**-25 + position * 2e-16, rtol=0)


@pytest.mark.parametrize("scaling", sorted(scalings.SCALINGS))
@pytest.mark.parametrize("d,base", [(64, 10000.0), (32, 500000.0), (6, 10.0)])
def test_every_scaling_is_bitwise_plain_at_factor_one(scaling, d, base):
    plain = rope.frequencies(d, base)
    for seq_len in (None, L0 // 2, 8 * L0):
        inv_freq, attn_factor = scalings.scaled_frequencies(d, base, scaling, 1.0, L0, seq_len)
        assert torch.equal(inv_freq, plain) and attn_factor == 1.0


def test_linear_at_two_puts_position_2p_where_plain_had_p():
    inv_freq, _ = scalings.scaled_frequencies(64, 10000.0, "linear", 2.0)
    p = torch.arange(0, 4 * L0, 7)
    # dividing by 2 is exact in floating point, so the angles agree bit for bit
    for a, b in zip(rope.tables(inv_freq, 2 * p), tables(64, p), strict=True):
        assert torch.equal(a, b)


def test_ntk_keeps_the_highest_and_divides_the_lowest_frequency():
    plain = rope.frequencies(64)
    for s in (2.0, 4.0, 16.0):
        f, _ = scalings.scaled_frequencies(64, 10000.0, "ntk", s)
        assert f[0].item() == 1.0
        assert (f[-1] / plain[-1]).item() == pytest.approx(1 / s, rel=1e-5)
        ratio = f / plain
        assert torch.all(ratio[1:] < ratio[:-1])  # interpolates more the slower a pair turns


def test_dynamic_is_plain_within_the_trained_context_and_ntk_beyond():
    plain = rope.frequencies(64)
    for seq_len in (None, 1, L0):
        assert torch.equal(scalings.scaled_frequencies(64, 10000.0, "dynamic", 4.0, L0, seq_len)[0], plain)
    beyond = scalings.scaled_frequencies(64, 10000.0, "dynamic", 2.0, L0, 2 * L0)[0]
    assert not torch.allclose(beyond, plain)
    # s_L = s*L/L0 - (s-1) = 3 at L = 2 L0 with s = 2
    assert torch.equal(beyond, scalings.scaled_frequencies(64, 10000.0, "ntk", 3.0)[0])
    # joins plain RoPE continuously: one position past L0 the lowest frequency is divided by s_L = 1 + s/L0
    just_past = scalings.scaled_frequencies(64, 10000.0, "dynamic", 2.0, L0, L0 + 1)[0]
    assert (plain[-1] / just_past[-1]).item() == pytest.approx(1 + 2.0 / L0, rel=1e-5)


def deployed_yarn(d, base, s, L0, beta_fast=32.0, beta_slow=1.0):
    """YaRN's frequencies as its authors' code and transformers compute them, written out in plain floats."""

    def pair(turns):  # the pair index whose frequency turns `turns` times within L0
        return d * math.log(L0 / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = max(math.floor(pair(beta_fast)), 0), min(math.ceil(pair(beta_slow)), d - 1)
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        ramp = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
        out.append(theta / s * ramp + theta * (1 - ramp))
    return out


@pytest.mark.parametrize(
    "d,base,L0,s",
    [(32, 1e4, 64, 2.0), (64, 1e4, 4096, 4.0), (128, 5e5, 8192, 32.0), (64, 1e4, 256, 8.5), (16, 10.0, 8, 2.0)],
)
def test_yarn_is_the_deployed_pair_index_ramp_with_its_temperature(d, base, L0, s):
    f, attn_factor = scalings.scaled_frequencies(d, base, "yarn", s, L0)
    torch.testing.assert_close(f, torch.tensor(deployed_yarn(d, base, s, L0), dtype=torch.float64), rtol=1e-6, atol=0)
    assert attn_factor == pytest.approx((0.1 * math.log(s) + 1) ** 2, rel=1e-12)
    plain = rope.frequencies(d, base)
    assert torch.all(f <= plain) and torch.all(f >= plain / s * (1 - 1e-12))


def test_yarn_keeps_the_fastest_pair_where_the_papers_text_would_slow_it():
    # d = 32, base 1e4, L0 = 64, s = 2: D(32) < 0 and D(1) = 4.03, so the ramp runs over pairs 0..5; the paper's
    # ramp in turns would keep only 0.648 theta of the fastest pair, which turns ~10 times (< beta_fast = 32)
    f, _ = scalings.scaled_frequencies(32, 1e4, "yarn", 2.0, 64)
    plain = rope.frequencies(32, 1e4)
    assert f[0].item() == 1.0 and f[1].item() == pytest.approx(plain[1].item() * 0.9, rel=1e-12)
    torch.testing.assert_close(f[5:], plain[5:] / 2, rtol=1e-15, atol=0)


def test_yarn_matches_transformers():
    rope_init = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    d, base, L0, s = 64, 10000.0, 256, 4.0
    cfg = LlamaConfig(
        hidden_size=d * 4,
        num_attention_heads=4,
        max_position_embeddings=int(L0 * s),
        rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": s, "original_max_position_embeddings": L0},
    )
    inv_freq, attention_factor = rope_init.ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    f, attn_factor = scalings.scaled_frequencies(d, base, "yarn", s, L0)
    torch.testing.assert_close(f.float(), inv_freq.float(), rtol=1e-6, atol=0)
    assert attn_factor == pytest.approx(attention_factor**2, rel=1e-6)  # theirs scales cos and sin: q and k each


def test_llama3_wavelength_bands_are_continuous_at_their_edges():
    # With rot_dim 4 the second frequency is base^(-1/2), wavelength 2 pi sqrt(base): choose base
    # to put that wavelength just below or just above each band edge.
    s = 8.0

    def ratio(wavelength):
        base = (wavelength / (2 * math.pi)) ** 2
        f, _ = scalings.scaled_frequencies(4, base, "llama3", s, L0)
        return (f[1] / rope.frequencies(4, base)[1]).item()

    short_edge, long_edge = L0 / 4, L0 / 1
    for edge, value in ((short_edge, 1.0), (long_edge, 1 / s)):
        below, above = ratio(edge * (1 - 1e-5)), ratio(edge * (1 + 1e-5))
        assert below == pytest.approx(above, abs=1e-4) and below == pytest.approx(value, abs=1e-4)
    assert ratio(short_edge * 0.9) == 1.0 and ratio(long_edge * 2) == pytest.approx(1 / s, rel=1e-6)
    middle = ratio(math.sqrt(short_edge * long_edge))
    assert 1 / s + 0.05 < middle < 1 - 0.05


def test_llama3_keeps_high_and_divides_low_frequencies():
    plain = rope.frequencies(64, 500000.0)
    f, attn_factor = scalings.scaled_frequencies(64, 500000.0, "llama3", 8.0, L0)
    wavelength = 2 * math.pi / plain
    high, low = wavelength < L0 / 4, wavelength > L0
    assert high.any() and low.any() and attn_factor == 1.0
    assert torch.equal(f[high], plain[high])
    torch.testing.assert_close(f[low], plain[low] / 8.0, rtol=1e-6, atol=0)


# ---- partial rotary ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_partial_rotary_passes_the_rest_through_and_uses_its_own_width(layout):
    torch.manual_seed(4)
    r = rope_scheme(64, fraction=0.25, layout=layout)
    assert r.rot_dim == 16
    # the frequency exponent counts the rotated width, not the head size
    assert torch.equal(r.inv_freq, rope.frequencies(16))
    assert not torch.equal(r.inv_freq, rope.frequencies(64)[:8])
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 10, 64).to(dtype)
        y = shifted(r, x, 5)
        assert y.dtype == dtype and torch.equal(y[..., 16:], x[..., 16:])
    x = torch.randn(1, 1, 10, 64)
    y = shifted(r, x, 5)
    v = x if layout == "interleaved" else x[..., torch.cat((rope.half_to_interleaved(16), torch.arange(16, 64)))]
    ref = reference(v, range(5, 15), rope.frequencies(16))  # identity beyond dim 16
    if layout == "half":
        ref = ref[..., torch.cat((rope.half_to_interleaved(16).argsort(), torch.arange(16, 64)))]
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fraction", [0.3, 0.0, 1.5, -1.0])
def test_bad_rotary_width_is_a_value_error(fraction):
    with pytest.raises(ValueError, match="rope_fraction"):
        rope_scheme(64, fraction=fraction)


# ---- RoPE's tables: precision, offsets, growth ---------------------------------------------------


def float64_rope(x, positions, d):
    theta = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angles = torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (T, d/2)
    return rope.apply_rope(x.double(), angles.cos(), angles.sin())


def test_bf16_module_keeps_float32_tables_and_distinct_positions():
    fresh = rope_scheme(64, block_size=L0)
    for convert in (lambda m: m.to(torch.bfloat16), lambda m: m.half()):
        r = convert(rope_scheme(64, block_size=L0))
        for name in ("inv_freq", "cos", "sin"):
            # rebuilt, not cast back: bitwise equal to tables never rounded
            assert torch.equal(getattr(r, name), getattr(fresh, name)), name
    r = rope_scheme(64, block_size=L0).to(torch.bfloat16)
    x = torch.randn(1, 1, 1, 64).to(torch.bfloat16)
    assert not torch.equal(shifted(r, x, 256), shifted(r, x, 257))  # a bf16 angle cannot tell them apart
    x = torch.randn(1, 2, 8 * L0, 64).to(torch.bfloat16)
    y = shifted(r, x)
    assert y.dtype == torch.bfloat16 and r.cos.dtype == torch.float32
    ref = float64_rope(x, range(8 * L0), 64)
    rel = (y.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.max().item() < 1e-2


def test_autocast_leaves_tables_and_results_in_float32():
    x = torch.randn(1, 2, 40, 64)
    expected = shifted(rope_scheme(64, block_size=64), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = rope_scheme(64, block_size=16)
        y = shifted(r, x)  # grows the table under autocast
    assert r.cos.dtype == torch.float32 and y.dtype == torch.float32
    assert torch.equal(y, expected)


def test_tables_are_not_in_the_state_dict():
    assert rope_scheme(64).state_dict() == {}


@pytest.mark.parametrize("layout", rope.LAYOUTS)
@pytest.mark.parametrize("scaling", ["none", "dynamic", "yarn"])
def test_offset_equals_slicing_a_longer_sequence(layout, scaling):
    torch.manual_seed(5)
    r = rope_scheme(
        32, layout=layout, scaling=scaling, factor=1.0 if scaling == "none" else 2.0, original_len=64, block_size=128
    )
    x = torch.randn(2, 3, 100, 32)
    full = shifted(r, x)
    pieces = [(0, 7), (40, 20), (99, 1), (60, 40)]
    if scaling == "dynamic":  # its frequencies follow the total length, so only pieces ending at 100 agree
        pieces = [(o, t) for o, t in pieces if o + t == 100]
    for o, t in pieces:
        torch.testing.assert_close(shifted(r, x[:, :, o : o + t], o), full[:, :, o : o + t], atol=1e-6, rtol=0)


def test_dynamic_rotary_uses_the_current_length():
    r = rope_scheme(64, scaling="dynamic", factor=2.0, original_len=L0, block_size=L0)
    x = torch.randn(1, 1, 1, 64)
    for end in (100, L0, 3 * L0):
        inv_freq, _ = scalings.scaled_frequencies(64, 10000.0, "dynamic", 2.0, L0, seq_len=end)
        expected = rope.apply_rope(x, *rope.tables(inv_freq, torch.tensor([end - 1])))
        assert torch.equal(shifted(r, x, end - 1), expected)


def test_table_grows_in_eager_mode_to_a_freshly_built_table():
    r = rope_scheme(64, block_size=16)
    x = torch.randn(1, 2, 8, 64)
    y = shifted(r, x, 40)
    n = r.cos.shape[0]
    assert n >= 48
    big = rope_scheme(64, block_size=n)
    assert torch.equal(r.cos, big.cos) and torch.equal(r.sin, big.sin)
    assert torch.equal(y, shifted(big, x, 40))


def test_table_cannot_grow_inside_a_compiled_region(monkeypatch):
    r = rope_scheme(64, block_size=16)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match="block_size >= 20"):
        shifted(r, torch.randn(1, 1, 4, 64), 16)


def test_a_scaled_rotary_uses_its_scalings_frequencies_and_temperature():
    r = rope_scheme(64, scaling="yarn", factor=4.0, block_size=L0)
    f, attn = scalings.scaled_frequencies(64, 10000.0, "yarn", 4.0, L0)
    assert torch.equal(r.inv_freq, f) and r.attn_factor == attn > 1
    assert torch.equal(r.cos, rope.tables(f, torch.arange(L0))[0])
    with pytest.raises(ValueError, match="factor=0.5"):
        rope_scheme(64, scaling="ntk", factor=0.5)


# ---- autograd and compile ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", rope.LAYOUTS)
@pytest.mark.parametrize("hs", [8, 11])
def test_gradcheck(layout, hs):
    torch.manual_seed(6)
    x = torch.randn(2, 2, 5, hs, dtype=torch.float64, requires_grad=True)
    angles = torch.randn(5, 3, dtype=torch.float64) * 10
    cos, sin = angles.cos().requires_grad_(), angles.sin().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: rope.apply_rope(*a, layout=layout), (x, cos, sin))


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Torchinductor does not support")
@pytest.mark.slow
def test_compiled_rotary_matches_eager_forward_and_backward():
    # One full graph covers both layouts, an offset and a partial rotary. The aot_eager backend runs
    # dynamo's capture and AOTAutograd's trace (what rope.py's code decides) without inductor's C++
    # build, which would add tens of seconds on a cold cache.
    inter, half = rope_scheme(16, block_size=32), rope_scheme(16, fraction=0.5, layout="half", block_size=32)

    def f(q):
        return shifted(inter, q) * 2 + shifted(half, q, 3)

    torch.manual_seed(7)
    q = torch.randn(2, 2, 8, 16, requires_grad=True)
    g = torch.randn(2, 2, 8, 16)
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(q)
    (dq,) = torch.autograd.grad(y, q, g)
    y_eager = f(q)
    (dq_eager,) = torch.autograd.grad(y_eager, q, g)
    torch.testing.assert_close(y, y_eager, atol=1e-6, rtol=0)
    torch.testing.assert_close(dq, dq_eager, atol=1e-6, rtol=0)


# ---- input validation -------------------------------------------------------------------------


def test_bad_inputs_are_value_errors_naming_the_choices():
    cos, sin = tables(8, [0, 1])
    with pytest.raises(ValueError, match="'diag'.*interleaved"):
        rope.apply_rope(torch.randn(2, 8), cos, sin, layout="diag")
    with pytest.raises(ValueError, match="layout='diag'"):
        rope_scheme(8, layout="diag")
    with pytest.raises(ValueError, match="'xpos'.*yarn"):
        scalings.scaled_frequencies(8, 10000.0, "xpos")
    with pytest.raises(ValueError, match="scaling='xpos'"):
        rope_scheme(8, scaling="xpos")
    for factor in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="factor"):
            scalings.scaled_frequencies(8, 10000.0, "linear", factor)
    with pytest.raises(ValueError, match="original_len"):
        scalings.scaled_frequencies(8, 10000.0, "yarn", 2.0)
    with pytest.raises(ValueError, match="rot_dim=7"):
        rope.frequencies(7)
    with pytest.raises(ValueError, match="hs=8"):
        rope.apply_rope(torch.randn(2, 8), *tables(16, [0, 1]))
    with pytest.raises(ValueError, match="positions"):
        rope.tables(rope.frequencies(8), torch.tensor([0.0, 1.0]))


# ---- the registry of scalings: each entry carries what its name stands for --------------------


@pytest.mark.parametrize("name", scalings.SCALINGS)
def test_a_scaling_reads_l0_and_the_length_where_its_entry_says(name):
    scaling = scalings.SCALINGS[name]
    try:
        scalings.scaled_frequencies(16, 10000.0, name, 4.0)
    except ValueError as e:
        assert scaling.needs_original_len and "needs original_len" in str(e)
    else:
        assert not scaling.needs_original_len
    at = [scalings.scaled_frequencies(16, 10000.0, name, 4.0, 32, seq_len=L)[0] for L in (None, 32, 128)]
    assert torch.equal(at[0], at[1]) and torch.equal(at[0], at[2]) != scaling.dynamic


@pytest.mark.parametrize("name", scalings.SCALINGS)
@pytest.mark.parametrize("L0", [32, 48])
def test_transformers_parameters_of_a_scaling_read_back_to_the_same_frequencies(name, L0):
    scaling, factor = scalings.SCALINGS[name], (1.0 if name == scalings.NO_SCALING else 4.0)
    params = scaling.hf_parameters(16, 500.0, factor, L0)
    base, read, s, L0_read = scalings.from_hf(params, scaling.hf_context(64, L0, factor))
    for L in (None, 256):
        ours = scalings.scaled_frequencies(16, 500.0, name, factor, L0, L)
        theirs = scalings.scaled_frequencies(16, base, read, s, L0_read, L)
        assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1]  # bit for bit
    assert (read, base) == (scalings.NO_SCALING, rope.ntk_base(16, 500.0, 4.0)) if scaling.new_base else read == name


def test_transformers_parameters_with_no_equivalent_here_are_named():
    with pytest.raises(ValueError, match="^rope_type='longrope' has no nanorope scaling; supported: default, linear"):
        scalings.from_hf({"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}, 64)
    yarn = scalings.SCALINGS["yarn"].hf_parameters(16, 1e4, 2.0, 32)
    with pytest.raises(
        ValueError, match="^rope_type='yarn' with beta_fast=16.0: nanorope's yarn has beta_fast=32.0, beta_slow=1.0$"
    ):
        scalings.from_hf(yarn | {"beta_fast": 16.0}, 64)
    with pytest.raises(ValueError, match="^rope_type='linear' with mscale=2.0: nanorope's linear has no such"):
        scalings.from_hf({"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "mscale": 2.0}, 64)


@pytest.mark.parametrize(
    "scaling, factor, stretch, result",
    [
        (None, None, None, (scalings.NO_SCALING, 1.0)),
        ("none", 1.0, None, (scalings.NO_SCALING, 1.0)),
        ("yarn", 2.0, 8.0, ("yarn", 2.0)),  # a factor given is the factor
        ("yarn", None, 8.0, ("yarn", 8.0)),  # else the one the use asks for
        (
            None,
            2.0,
            None,
            "rope_scaling_factor=2 does nothing without a rope_scaling (linear, ntk, dynamic, yarn, llama3)",
        ),
        ("none", 2.0, 8.0, "rope_scaling_factor=2 does nothing without a rope_scaling"),
        ("linear", None, None, "rope_scaling='linear' needs its factor"),
    ],
)
def test_one_rule_for_a_scaling_and_its_factor(scaling, factor, stretch, result):
    if isinstance(result, tuple):
        assert scalings.scaling_pair(scaling, factor, stretch) == result
    else:
        with pytest.raises(ValueError, match="^" + re.escape(result)):
            scalings.scaling_pair(scaling, factor, stretch)


def test_no_scaling_name_is_compared_outside_rope_py():
    """The registry entry carries what a name stands for: a name compared elsewhere is a missing attribute."""
    # "none" is also a value of other settings (log, cache, reduction, pos_emb) compared in their own modules
    names = set(scalings.SCALINGS) - {scalings.NO_SCALING}

    def named(node):  # a scaling name, or a tuple, list or set of constants holding one
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(n, ast.Constant) and n.value in names for n in items)

    found = []
    for p in sorted([*ROOT.glob("*.py"), *ROOT.glob("lab/*.py"), *ROOT.glob("data/*.py")]):
        for node in ast.walk(ast.parse(p.read_text())) if p.name != "rope.py" else ():
            if isinstance(node, ast.Compare):
                hit = any(named(n) for n in [node.left, *node.comparators])
            else:
                hit = isinstance(node, ast.match_case) and any(
                    isinstance(n, ast.MatchValue) and named(n.value) for n in ast.walk(node.pattern)
                )
            if hit:
                found.append(f"{p.relative_to(ROOT)}:{getattr(node, 'lineno', node.pattern.lineno)}")
    assert not found


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_the_default_path_computes_the_pair_formula_to_the_bit_forward_and_backward(layout):
    """apply_rope runs the interleaved layout eagerly as one complex product (faster: bench.py's rope_apply); its
    values and gradients are rotate_pairs', the pair formula a cos - b sin, a sin + b cos, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 37, 16, generator=g, dtype=torch.float32)
    grad = torch.randn(2, 3, 37, 16, generator=g)
    cos, sin = rope.tables(rope.frequencies(16), torch.arange(1000, 1037))  # (37, 8)
    outs, grads = [], []
    for turn in (rope.apply_rope, rope.rotate_pairs):
        leaf = x.clone().requires_grad_()
        out = turn(leaf, cos, sin, layout)
        outs.append(out.detach())
        grads.append(torch.autograd.grad(out, leaf, grad)[0])
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
