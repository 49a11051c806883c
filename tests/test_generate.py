"""generate.py: the KV cache against full recomputation for every registered scheme, the window slide,
compiled decoding, and the pick of the next token against its reference distributions."""

import shutil

import pytest
import torch

import scalings
from conftest import all_logits, tiny_model as tiny
from generate import GREEDY, KVCache, Sampling, StaticKVCache, generate
from model import all_schemes


def read(model, tokens, cache):
    """The logits of a forward through the cache, which then holds the tokens (as a decoder advances it)."""
    logits, _ = model(tokens, cache=cache)
    cache.advance(tokens.shape[1])
    return logits


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_cached_logits_equal_full_recompute(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 14))
    full = all_logits(model, idx)
    cache = KVCache(model.config, 2, 16, "cpu", torch.float32)
    prefill = read(model, idx[:, :9], cache)  # last position only
    steps = [read(model, idx[:, t : t + 1], cache) for t in range(9, 14)]
    torch.testing.assert_close(prefill[:, -1], full[:, 8], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 9:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_static_cache_logits_equal_full_recompute(pos_emb):
    # every slot is attended to; those past the query, unwritten or stale, must count for nothing
    model = tiny(pos_emb, qk_norm=True)
    idx = torch.randint(0, 11, (2, 14))
    full = all_logits(model, idx)
    model.scheme.reserve(16)
    cache = StaticKVCache(model.config, 2, 16, "cpu", torch.float32)
    for k in (*cache.k, *cache.v):
        k.normal_()  # stale values from an earlier window
    prefill = read(model, idx[:, :9], cache)
    steps = [read(model, idx[:, t : t + 1], cache) for t in range(9, 14)]
    assert cache.length.item() == 14 and cache.k[0].shape[2] == 16
    torch.testing.assert_close(prefill[:, -1], full[:, 8], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 9:], atol=1e-5, rtol=1e-4)


def taught(pos_emb):
    """A tiny model taught one random sequence, and that sequence: a random model greedily repeats
    one token, a taught one continues it, varied."""
    model = tiny(pos_emb).train()
    seq = torch.randint(0, 11, (1, 17))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model(seq[:, :-1], seq[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), seq


def greedy(model, prompt, **kw):
    n = 40  # 5 + 40 tokens through a 16-token window: several slides
    return torch.cat(list(generate(model, prompt, n, GREEDY, **kw)), 1)


@pytest.mark.parametrize("pos_emb", all_schemes())
@pytest.mark.slow
def test_greedy_with_cache_matches_recompute_across_window_slides(pos_emb):
    model, seq = taught(pos_emb)
    cached = greedy(model, seq[:, :5], cache="dynamic")
    assert torch.equal(cached, greedy(model, seq[:, :5], cache="none"))
    assert len(set(cached[0].tolist())) > 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Torchinductor does not support")
def test_compiled_decoding_matches_recompute_across_window_slides_in_three_whole_graphs():
    model, seq = taught("rope")
    torch._dynamo.reset()  # count this test's graphs only
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = greedy(model, seq[:, :5], compile=True)
    assert torch.equal(compiled, greedy(model, seq[:, :5], cache="none"))
    assert len(set(compiled[0].tolist())) > 1
    # the first step, the later steps, the re-read after a slide; no graph breaks (a break would
    # compile each block on its own, several times slower)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 3
    with pytest.raises(ValueError, match="compile=True compiles the cached decoding; it needs a cache"):
        greedy(model, seq[:, :5], compile=True, cache="none")


@pytest.mark.parametrize("pos_emb", ["rope", "alibi"])
def test_static_cache_gives_the_dynamic_caches_greedy_tokens_across_window_slides(pos_emb):
    model, seq = taught(pos_emb)
    static = greedy(model, seq[:, :5], cache="static")
    assert torch.equal(static, greedy(model, seq[:, :5]))
    assert len(set(static[0].tolist())) > 1
    with pytest.raises(ValueError, match="cache='paged' is unknown; choose one of dynamic, static, none"):
        greedy(model, seq[:, :5], cache="paged")


def test_static_cache_refuses_dynamic_scaling_past_the_trained_length():
    model = tiny("rope", rope_scaling="dynamic", rope_scaling_factor=2.0)
    with pytest.raises(ValueError, match="static_cache cannot serve rope_scaling='dynamic' past the trained length"):
        next(generate(model, torch.zeros(1, 1, dtype=torch.long), 5, cache="static", max_context=32))
    assert model.scheme.at_length is not None  # at factor 2 RoPE too recomputes its frequencies past L0


def test_static_cache_serves_dynamic_scaling_at_factor_1_past_the_trained_length():
    # dynamic at factor 1 is plain RoPE, by one rule in scalings.of_model, GPTConfig.scaling and the static cache: its
    # fixed table serves every length, so decoding past L0 never recomputes the frequencies
    model = tiny("rope", rope_scaling="dynamic", rope_scaling_factor=1.0)
    assert model.scheme.at_length is None and not scalings.scaling_of(model.config).dynamic
    assert torch.equal(model.scheme.inv_freq, tiny("rope").scheme.inv_freq)
    plain = greedy(tiny("rope"), torch.zeros(1, 1, dtype=torch.long), cache="static", max_context=32)
    assert torch.equal(greedy(model, torch.zeros(1, 1, dtype=torch.long), cache="static", max_context=32), plain)


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("c++") or shutil.which("g++")), reason="torch.compile on CPU needs a C++ compiler"
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Torchinductor does not support")
@pytest.mark.parametrize("pos_emb", ["rope", "alibi"])
def test_static_cache_compiles_to_one_whole_graph_for_every_position(pos_emb):
    model, seq = taught(pos_emb)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = greedy(model, seq[:, :5], cache="static", compile=True)  # fullgraph=True: a break would raise
    assert torch.equal(compiled, greedy(model, seq[:, :5], cache="none"))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1  # every position, before and after the slides, in one graph


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_schemes_that_extrapolate_generate_past_block_size_and_the_others_refuse(pos_emb):
    model, prompt = tiny(pos_emb), torch.zeros(1, 1, dtype=torch.long)
    if all_schemes()[pos_emb].extrapolates:  # 40 tokens in a 48-token context: positions up to 3 x block_size
        cached = torch.cat(list(generate(model, prompt, 40, GREEDY, max_context=48)), 1)
        assert torch.equal(cached, torch.cat(list(generate(model, prompt, 40, GREEDY, "none", max_context=48)), 1))
    else:
        with pytest.raises(ValueError, match=f"{pos_emb} positions stop at block_size=16"):
            list(generate(model, prompt, 5, max_context=48))


def draw(logits, temperature, top_k=None, top_p=None, seed=None, generator=None):
    generator = torch.Generator().manual_seed(seed) if seed is not None else generator
    sampling = Sampling(temperature, top_k, top_p)
    return sampling.pick(logits, sampling.noise(*logits.shape, logits.device, generator))


# ----------------------------------------------------------------------------- each row's own positions

SKIPPED = torch.tensor([[0, 1, 2, 6, 7, 8, 9, 13, 14, 15], [0, 3, 4, 5, 6, 7, 8, 9, 10, 12]])  # PoSE-like ids, < 16


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_cached_logits_at_each_rows_own_positions_equal_full_recompute(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(3))
    full = all_logits(model, idx, position_ids=SKIPPED)
    cache = KVCache(model.config, 2, 16, "cpu", torch.float32)
    logits, _ = model(idx[:, :6], cache=cache, position_ids=SKIPPED[:, :6])
    cache.advance(6)
    steps = [logits[:, -1]]
    for t in range(6, 9):
        logits, _ = model(idx[:, t : t + 1], cache=cache, position_ids=SKIPPED[:, t : t + 1])
        cache.advance(1)
        steps.append(logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 5:9], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", [name for name, cls in all_schemes().items() if cls.extrapolates])
def test_greedy_decoding_at_each_rows_own_positions_is_recomputes_across_window_slides(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(4))
    tokens = {
        cache: torch.cat(list(generate(model, idx, 14, GREEDY, cache, max_context=12, position_ids=SKIPPED)), 1)
        for cache in ("dynamic", "none")
    }
    assert torch.equal(tokens["dynamic"], tokens["none"])
    with pytest.raises(ValueError, match="static_cache takes no per-row position ids"):
        next(generate(model, idx, 1, GREEDY, "static", position_ids=SKIPPED))


def test_pick_controls():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    assert GREEDY.pick(logits, GREEDY.noise(1, 4, "cpu")).item() == 0
    draws = {draw(logits, 1.0, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {0, 1}
    # nucleus at 0.7: tokens 0 (0.5) and 1 (0.3) reach the mass, token 2 never appears
    draws = {draw(logits, 1.0, top_p=0.7, generator=g).item() for _ in range(200)}
    assert draws == {0, 1}
    draws = {draw(logits, 1.0, top_p=0.5, generator=g).item() for _ in range(50)}
    assert draws == {0}


def test_picked_tokens_are_torch_multinomials_for_the_same_seed():
    # pick's docstring: torch.multinomial draws one sample by the same race, so a seed gives the same text
    logits = torch.randn(16, 65)
    for seed in range(10):
        expected = torch.multinomial((logits / 0.8).softmax(-1), 1, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(draw(logits, 0.8, seed=seed), expected)


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (1.0, 3)])
def test_picked_tokens_follow_the_tempered_truncated_distribution(temperature, top_k):
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    p = (logits.double() / temperature).softmax(-1)  # the reference, in float64
    if top_k is not None:
        p[p.argsort(descending=True)[top_k:]] = 0.0
        p /= p.sum()
    n = 40_000
    draws = draw(logits.expand(n, 4), temperature, top_k, seed=0)
    freq = torch.bincount(draws.flatten(), minlength=4).double() / n
    # 5 standard errors of a frequency; a dropped token is never drawn
    assert torch.all((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()), (freq, p)
