"""positions.py: the registry's contract, and the non-RoPE schemes' maths against their papers' formulas.
The generic behaviour of every registered scheme (causality, shifts, cache exactness) is tested in
test_model.py and test_generate.py, parametrized over all_schemes()."""

import math
from dataclasses import fields, make_dataclass, replace

import pytest
import torch

import config
import model
import positions
import rope
import scalings
import schemes
from config import RATE, opt
from conftest import all_logits, tiny_model as tiny
from generate import GREEDY, generate
from model import GPTConfig, all_schemes, scheme_class
from spans import Span


def at(start, T, keys=None):
    """The Span of T queries from position start and the keys up to the last of them (all start + T by default)."""
    return Span(start, T, start + T if keys is None else keys, "cpu")


def test_a_span_says_which_keys_each_query_sees_in_training_after_a_cache_and_in_static_slots():
    assert torch.equal(at(0, 3).distances(), torch.tensor([[0, -1, -2], [1, 0, -1], [2, 1, 0]]))
    assert at(0, 3).attention_mask() == (None, True)  # the causal triangle: is_causal
    assert at(4, 1).attention_mask() == (None, False)  # one new token sees every key
    mask, causal = at(4, 2, 6).attention_mask()  # two new tokens at 4, 5 after 4 cached
    assert not causal and torch.equal(mask, torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]).bool())
    static = Span(torch.tensor(2), 1, 5, "cpu")  # a static step: one query at 2 over 5 slots, 3 and 4 unwritten
    assert static.end == 5 and torch.equal(static.ids, torch.tensor([2]))
    assert torch.equal(static.attention_mask()[0], torch.tensor([[True, True, True, False, False]]))
    with pytest.raises(ValueError, match="start position -1 must be >= 0"):
        at(-1, 2)


def test_sinusoidal_table_matches_its_formula():
    pe = positions.sinusoidal_table(100, 16, base=10000.0)
    assert pe.shape == (100, 16) and pe.dtype == torch.float32
    for p in (0, 1, 37, 99):
        for i in range(8):
            w = 10000.0 ** (2 * i / 16)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p / w), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p / w), abs=1e-6)
    with pytest.raises(ValueError, match="d=15"):
        positions.sinusoidal_table(10, 15)


def test_alibi_slopes_follow_the_papers_rule():
    assert schemes.alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    # 12 heads: the 8-head sequence 2^(-8h/8), then h = 1, 3, 5, 7 of the 16-head one 2^(-8h/16)
    expected = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    torch.testing.assert_close(schemes.alibi_slopes(12), torch.tensor(expected), rtol=1e-7, atol=0)
    torch.testing.assert_close(schemes.alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)]))
    assert schemes.alibi_slopes(1).tolist() == [2.0**-8]
    with pytest.raises(ValueError, match="n_head=0"):
        schemes.alibi_slopes(0)


def test_alibi_bias_values_mask_and_offset():
    scheme = tiny("alibi", n_head=4).scheme  # slopes 1/4, 1/16, 1/64, 1/256
    b = scheme.bias(at(2, 3, 5), 0)  # queries at positions 2, 3, 4; keys 0..4
    assert b.shape == (4, 3, 5) and b.dtype == torch.float32
    assert b[0, 0, 0].item() == -0.5 and b[0, 0, 2].item() == 0.0 and b[1, 2, 1].item() == -3 / 16
    assert b[0, 0, 3].item() == -math.inf and b[3, 1, 4].item() == -math.inf and b[2, 2, 4].item() == 0.0
    square = scheme.bias(at(0, 6, 6), 0)
    assert torch.equal(torch.isinf(square[1]), torch.ones(6, 6).triu(1).bool())
    # one new token with a KV cache of 5 sees the last row of the full square
    torch.testing.assert_close(scheme.bias(at(5, 1, 6), 0), square[:, 5:])


def test_sinusoidal_input_is_scaled_tokens_plus_the_table():
    # the paper scales token embeddings by sqrt(d) before adding the table; without it the +-1 table
    # drowns std-0.02 embeddings and the scheme cannot learn in a short run
    model = tiny("sinusoidal")
    tok = torch.randn(2, 5, 32)
    expected = tok * math.sqrt(32) + positions.sinusoidal_table(8, 32)[3:8]
    torch.testing.assert_close(model.scheme.embed(tok, at(3, 5)), expected)
    far = model.scheme.embed(tok, at(40, 5))  # past the built table: computed from the formula on demand
    torch.testing.assert_close(far, tok * math.sqrt(32) + positions.sinusoidal_table(45, 32)[40:45])


# ----------------------------------------------------------------------------- the registry's contract


@pytest.mark.parametrize("name", all_schemes())
def test_each_scheme_keeps_shapes_and_its_bias_carries_the_causal_mask(name):
    scheme = tiny(name).scheme
    assert scheme.name == name and scheme_class(name) is type(scheme)
    tok, qk = torch.randn(2, 5, 32), torch.randn(2, 2, 2, 5, 16)  # (B, T, C); q and k (2, B, nh, T, hs)
    assert (
        scheme.embed(tok, at(3, 5)).shape == tok.shape and scheme.rotate(qk, at(3, qk.shape[-2]), 0).shape == qk.shape
    )
    bias = scheme.bias(at(3, 5, 8), 0)  # 5 queries at positions 3..7 after 3 cached keys, in the first block
    if bias is not None:
        assert bias.shape == (2, 5, 8)
        future = torch.ones(5, 8, dtype=torch.bool).triu(4)  # query i at position 3 + i never sees key j > 3 + i
        assert torch.isneginf(bias[:, future]).all() and torch.isfinite(bias[:, ~future]).all()


def test_an_unknown_scheme_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match="pos_emb='rotary' is unknown; choose one of rope, sinusoidal, learned, alibi"):
        GPTConfig(pos_emb="rotary")


def test_a_scheme_is_one_registered_class(monkeypatch):
    # a toy scheme registered from outside the library reaches the config, the model and decoding unchanged
    monkeypatch.setattr(positions, "SCHEMES", dict(all_schemes()))

    @positions.register("toy")
    class Toy(positions.Scheme):
        """Every score lowered by a constant beyond the causal mask: a softmax does not see it."""

        def bias(self, span, layer):
            return schemes.causal(torch.full((self.config.n_head, span.length, span.keys), -3.0), span)

    model, plain = tiny("toy"), tiny("none")
    idx = torch.randint(0, 11, (1, 12))
    torch.testing.assert_close(all_logits(model, idx), all_logits(plain, idx))
    cached = torch.cat(list(generate(model, idx[:, :3], 20, GREEDY)), 1)
    assert torch.equal(cached, torch.cat(list(generate(model, idx[:, :3], 20, GREEDY, cache="none")), 1))


# ----------------------------------------------------------------------------- the newer schemes' defining claims


def scores(scheme, q, k, T, layer=0):
    """(T, T) q_m . k_n after the scheme's rotate, q and k (hs,) the same at every position."""
    qk = torch.stack((q.expand(T, -1), k.expand(T, -1)))[:, None, None]  # (2, 1, 1, T, hs)
    rq, rk = scheme.rotate(qk, at(0, qk.shape[-2]), layer)[:, 0, 0].double()
    return rq @ rk.T


def test_p_rope_keeps_the_highest_frequencies_is_rope_at_one_and_nope_at_zero():
    inv = rope.frequencies(16)
    assert torch.equal(scalings.keep_highest(inv, 0.5), torch.cat((inv[:4], torch.zeros(4))))
    assert torch.equal(scalings.keep_highest(inv, 1.0), inv)
    idx = torch.randint(0, 11, (2, 16))
    assert torch.equal(all_logits(tiny("rope", rope_p=1.0), idx), all_logits(tiny("rope"), idx))
    torch.testing.assert_close(all_logits(tiny("rope", rope_p=0.0), idx), all_logits(tiny("none"), idx), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"rope_p=1.5 must lie in \[0, 1\]"):
        GPTConfig(rope_p=1.5)


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_xpos_scores_depend_on_the_distance_and_decay_by_zeta_per_pair(layout):
    xpos, plain = tiny("xpos", rope_layout=layout, xpos_scale_base=8.0).scheme, tiny("rope", rope_layout=layout).scheme
    q, k = torch.randn(16), torch.randn(16)
    s = scores(xpos, q, k, 24)
    for shift in (1, 5, 9):  # q_m . k_n is a function of m - n
        torch.testing.assert_close(s[shift:, shift:], s[:-shift, :-shift], atol=1e-5, rtol=1e-4)  # float32 maths
    # one pair alone: the score is RoPE's times zeta_i^((m - n)/B), zeta_0 = 0.4/1.4, the fastest decay
    pair = [0, 1] if layout == "interleaved" else [0, 8]
    q1, k1 = torch.zeros(16), torch.zeros(16)
    q1[pair], k1[pair] = q[pair], k[pair]
    m_minus_n = torch.arange(24)[:, None] - torch.arange(24)[None, :]
    expected = scores(plain, q1, k1, 24) * (0.4 / 1.4) ** (m_minus_n.double() / 8.0)
    torch.testing.assert_close(scores(xpos, q1, k1, 24), expected, atol=1e-6, rtol=1e-5)


def test_kerple_bias_is_its_formula_in_the_distance_and_causal():
    scheme = tiny("kerple").scheme
    for p in scheme.parameters():  # away from the start, where every head is the same
        torch.nn.init.normal_(p)
    bias = scheme.bias(at(3, 6, 9), 1)  # queries at 3..8, keys 0..8, second layer
    r1, r2 = (torch.nn.functional.softplus(r[1].double()) for r in (scheme.r1, scheme.r2))
    for i in range(6):
        for j in range(9):
            d = 3 + i - j
            want = -r1 * torch.log(1 + r2 * d) if d >= 0 else torch.full((2,), -math.inf, dtype=torch.float64)
            torch.testing.assert_close(bias[:, i, j].double(), want, rtol=1e-6, atol=1e-6)


def test_fire_bias_is_a_function_of_the_distance_below_its_threshold_and_causal():
    scheme = tiny("fire").scheme  # L starts at block_size / 4 = 4, c at 0.1
    assert scheme.threshold(0).item() == 4.0 and torch.nn.functional.softplus(scheme.c[0]).item() == pytest.approx(0.1)
    bias = scheme.bias(at(0, 4, 4), 0)  # queries and keys at 0..3, all below L
    dist = torch.arange(4)[:, None] - torch.arange(4)[None, :]
    assert torch.isneginf(bias[:, dist < 0]).all() and torch.isfinite(bias[:, dist >= 0]).all()
    for d in range(4):  # every (m, m - d) pair has the same bias
        diagonal = bias[:, dist == d]  # (nh, 4 - d)
        torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal))
    # past L the distance is normalised by the query's position: psi(d) / psi(m) with psi(x) = log(0.1 x + 1)
    far = scheme.bias(at(40, 1, 41), 0)[:, 0]  # one query at 40, keys 0..40
    x = torch.log1p(0.1 * torch.arange(40, -1, -1.0)) / math.log1p(0.1 * 40)
    hidden = torch.relu(x[:, None] * scheme.w1[0][:, 0] + scheme.b1[0])  # (41, 32)
    torch.testing.assert_close(far, (hidden @ scheme.w2[0].T + scheme.b2[0]).T.detach(), atol=1e-5, rtol=1e-5)


def test_fire_interpolates_inside_the_trained_context_and_its_threshold_stays_there_after_training():
    """The mechanism acts in training: L starts at L0 / 4 and, trained, stays below the longest training position,
    so queries past it see normalised distances (a fixed L at block_size never did)."""
    model = tiny("fire").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seq = torch.randint(0, 11, (8, 17))
    for _ in range(40):
        loss = model(seq[:, :-1], seq[:, 1:])[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    thresholds = [model.scheme.threshold(layer).item() for layer in range(2)]
    assert all(t < 15 for t in thresholds), thresholds  # the last training position is 15
    assert any(not torch.equal(p, torch.ones_like(p)) for p in model.scheme.multiplier)  # L was learned


def test_xpos_decay_within_the_trained_context_is_the_papers():
    """B = L0 / 2: the fastest pair decays by zeta_0^2 = 0.082 across L0 (B = 512 at L0 = 64 gave 0.86)."""
    xpos = tiny("xpos")
    cfg = xpos.config
    assert xpos.scheme.scale == cfg.block_size / 2
    assert (0.4 / 1.4) ** (cfg.block_size / xpos.scheme.scale) == pytest.approx(0.0816, abs=1e-4)
    assert xpos.scheme.window(0) == cfg.block_size  # blockwise past L0: never a distance it did not train at


def test_kerple_heads_start_at_different_ranges_as_its_authors_draw_them():
    scheme = tiny("kerple", n_head=8).scheme
    r1, r2 = (torch.nn.functional.softplus(r[0]) for r in (scheme.r1, scheme.r2))
    assert (0.01 <= r1).all() and (r1 <= 2).all() and (0.01 <= r2).all() and (r2 <= 1).all()
    assert r1.std() > 0.2 and r2.std() > 0.1  # U(0, 2) and U(0, 1), per head: not one value for all


def test_rnope_layers_without_rope_ignore_position_and_the_others_rotate():
    scheme = tiny("rnope", n_layer=4, nope_every=2).scheme  # layers 1 and 3 without positions
    qk = torch.randn(2, 1, 2, 5, 16)
    for layer in (1, 3):
        assert scheme.rotate(qk, at(7, qk.shape[-2]), layer) is qk
    for layer in (0, 2):
        assert torch.equal(
            scheme.rotate(qk, at(7, qk.shape[-2]), layer), tiny("rope").scheme.rotate(qk, at(7, qk.shape[-2]), layer)
        )
        assert not torch.allclose(scheme.rotate(qk, at(7, qk.shape[-2]), layer), qk)
    # RNoPE-SWA: the RoPE layers see the last block_size / 2 keys, the NoPE layers all of them
    assert [scheme.window(layer) for layer in range(4)] == [8, None, 8, None]
    mask, _ = at(0, 12).attention_mask(window=8)
    assert mask[11].tolist() == [False] * 4 + [True] * 8 and mask[3].tolist() == [True] * 4 + [False] * 8


# ----------------------------------------------------------------------------- each row's own positions


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_rows_at_the_default_positions_give_the_default_logits(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(5))
    shared, rows = all_logits(model, idx), all_logits(model, idx, position_ids=torch.arange(12).expand(3, 12))
    if model.scheme.bias(at(0, 12), 0) is None:  # the same kernels: bit for bit (PoSE without skips trains as plain)
        assert torch.equal(shared, rows)
    else:  # a score bias per row is a (B, nh, T, S) mask, which attention sums in another order
        torch.testing.assert_close(shared, rows, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_each_row_at_positions_of_its_own_is_what_the_row_alone_gives(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(6))
    ids = torch.tensor([[0, 1, 2, 3, 9, 10, 11, 12], [0, 4, 5, 6, 7, 8, 14, 15]])  # skips, below block_size 16
    both = all_logits(model, idx, position_ids=ids)
    for b in range(2):
        torch.testing.assert_close(both[b], all_logits(model, idx[b : b + 1], position_ids=ids[b : b + 1])[0])
    if pos_emb != "none":  # the positions are read: skipping them changes the logits after the skip
        assert not torch.allclose(both[0, 4:], all_logits(model, idx[:1])[0, 4:])
    if all_schemes()[pos_emb].relative:  # shifting every position of a row changes nothing
        torch.testing.assert_close(all_logits(model, idx[:1], position_ids=ids[:1] + 3), both[:1], atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- a new scheme is one class


def test_a_new_scheme_with_a_setting_of_its_own_is_one_class():
    """A toy scheme (token embeddings times a gain of its own) registered here: its setting is a flat key, refused
    for the other schemes, checked where it is declared, and it trains."""

    @positions.register("toy")
    class Toy(positions.Scheme):
        def embed(self, tok, span):
            return tok * self.config.toy_gain

    try:
        # its setting, as GPTConfig declares every scheme's
        setting = ("toy_gain", float, opt(1.0, "toy: the token embeddings' gain", applies="toy", check=RATE))
        Config = make_dataclass("Config", [setting], bases=(GPTConfig,))
        shape = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8", "--vocab_size=11"]
        (cfg,) = config.parse(["--pos_emb=toy", "--toy_gain=2.5", *shape], Config)
        assert cfg.toy_gain == 2.5 and cfg.takes("toy_gain") and not cfg.takes("toy_gain", "rope")
        with pytest.raises(
            ValueError, match="^toy_gain=2.5 does nothing for pos_emb='rope'; it applies to pos_emb toy$"
        ):
            config.parse(["--toy_gain=2.5", *shape], Config)
        with pytest.raises(ValueError, match="^toy_gain=0.0 must be a finite number > 0"):
            config.parse(["--pos_emb=toy", "--toy_gain=0", *shape], Config)
        torch.manual_seed(0)
        gpt = model.GPT(cfg)
        torch.manual_seed(0)
        plain = model.GPT(replace(cfg, toy_gain=1.0))  # the same weights
        idx = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(0))
        assert not torch.equal(all_logits(gpt, idx), all_logits(plain, idx))  # the setting reaches the scheme
        optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-2)
        losses = []
        for _ in range(5):
            loss = gpt(idx[:, :-1], idx[:, 1:])[1]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0]
    finally:
        del positions.SCHEMES["toy"]
    assert "toy_gain" not in {f.name for f in fields(GPTConfig)}


def test_the_schemes_named_elsewhere_are_those_schemes_py_defines():
    """positions.ELSEWHERE is what model.scheme_class imports schemes.py for: a scheme defined there and missing from
    it would pass every test that loops over the registry, yet be unknown to a fresh train.py."""
    defined = {cls.name for cls in all_schemes().values() if cls.__module__ == "schemes"}
    assert defined == set(positions.ELSEWHERE)
