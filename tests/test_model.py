"""The decoder: causality, what each positional scheme does to it, the KV cache, sampling controls."""

import math

import pytest
import torch

import rope
from model import GPT, POS_EMBS, GPTConfig, KVCache, pick, race_noise


def tiny(pos_emb, **kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11, pos_emb=pos_emb)
    return GPT(GPTConfig(**(cfg | kw))).eval()


def all_logits(model, idx, **kw):
    return model(idx, targets=idx, **kw)[0]  # targets make the model return every position's logits


@pytest.mark.parametrize("pos_emb", POS_EMBS)
def test_future_tokens_never_change_earlier_logits(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 16))
    changed = idx.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    a, b = all_logits(model, idx), all_logits(model, changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("pos_emb", ["rope", "alibi", "none"])
def test_relative_schemes_ignore_a_shift_of_all_positions(pos_emb):
    # RoPE scores depend on m - n only, so moving the whole sequence changes nothing; it also
    # shows values are not rotated (rotated values would carry absolute positions into the output)
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 12))
    torch.testing.assert_close(all_logits(model, idx), all_logits(model, idx, start_pos=37), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", ["sinusoidal", "learned"])
def test_absolute_schemes_see_a_shift(pos_emb):
    model = tiny(pos_emb)
    torch.nn.init.normal_(model.pos.wpe.weight) if pos_emb == "learned" else None
    idx = torch.randint(0, 11, (2, 8))
    assert not torch.allclose(all_logits(model, idx), all_logits(model, idx, start_pos=5), atol=1e-4)


@pytest.mark.parametrize("pos_emb", POS_EMBS)
def test_model_overfits_one_batch(pos_emb):
    model = tiny(pos_emb).train()
    idx = torch.randint(0, 11, (4, 16))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        loss = model(x, y)[1]
        first = first or loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0 and loss.item() < 0.25, (first, loss.item())


def test_weights_are_tied_and_initialised_at_gpt2_scales():
    model = tiny("rope", n_layer=4, n_embd=64)
    assert model.lm_head.weight is model.wte.weight
    assert abs(model.wte.weight.std().item() - 0.02) < 2e-3
    proj = model.blocks[0].attn.c_proj.weight
    assert abs(proj.std().item() - 0.02 / (2 * 4) ** 0.5) < 1e-3


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="pos_emb='rotary'"):
        GPTConfig(pos_emb="rotary")
    with pytest.raises(ValueError, match="n_embd=30 is not divisible by n_head=4"):
        GPTConfig(n_embd=30, n_head=4)


# ----------------------------------------------------------------------------- KV cache

@pytest.mark.parametrize("pos_emb", POS_EMBS)
def test_cached_logits_equal_full_recompute(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 14))
    full = all_logits(model, idx)
    cache = KVCache(model.config, 2, 16, "cpu", torch.float32)
    prefill, _ = model(idx[:, :9], cache=cache)  # last position only
    steps = [model(idx[:, t:t + 1], cache=cache)[0] for t in range(9, 14)]
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
    return torch.cat(list(model.generate(prompt, n, temperature=0, **kw)), 1)


@pytest.mark.parametrize("pos_emb", POS_EMBS)
def test_greedy_with_cache_matches_recompute_across_window_slides(pos_emb):
    model, seq = taught(pos_emb)
    cached = greedy(model, seq[:, :5], use_cache=True)
    assert torch.equal(cached, greedy(model, seq[:, :5], use_cache=False))
    assert len(set(cached[0].tolist())) > 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:Torchinductor does not support")
def test_compiled_decoding_matches_recompute_across_window_slides_in_three_whole_graphs():
    model, seq = taught("rope")
    torch._dynamo.reset()  # count this test's graphs only
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = greedy(model, seq[:, :5], compile=True)
    assert torch.equal(compiled, greedy(model, seq[:, :5], use_cache=False))
    assert len(set(compiled[0].tolist())) > 1
    # the first step, the later steps, the re-read after a slide; no graph breaks (a break would
    # compile each block on its own, several times slower)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 3
    with pytest.raises(ValueError, match="needs use_cache=True"):
        greedy(model, seq[:, :5], compile=True, use_cache=False)


def test_extrapolating_schemes_generate_past_block_size_but_learned_refuses():
    model = tiny("rope")
    out = list(model.generate(torch.zeros(1, 1, dtype=torch.long), 40, temperature=0, max_context=48))
    assert len(out) == 40
    with pytest.raises(ValueError, match="learned positions stop at block_size=16"):
        list(tiny("learned").generate(torch.zeros(1, 1, dtype=torch.long), 5, max_context=48))


# ----------------------------------------------------------------------------- sampling controls

def draw(logits, temperature, top_k=None, top_p=None, seed=None, generator=None):
    generator = torch.Generator().manual_seed(seed) if seed is not None else generator
    return pick(logits, race_noise(*logits.shape, logits.device, generator), temperature, top_k, top_p)


def test_pick_controls():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    assert pick(logits, None, temperature=0).item() == 0
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


def test_sinusoidal_input_is_scaled_tokens_plus_the_table():
    # the paper scales token embeddings by sqrt(d) before adding the table; without it the +-1 table
    # drowns std-0.02 embeddings and the scheme cannot learn in a short run
    model = tiny("sinusoidal")
    tok = torch.randn(2, 5, 32)
    expected = tok * math.sqrt(32) + rope.sinusoidal_table(8, 32)[3:8]
    torch.testing.assert_close(model.pos.embed(tok, 3), expected)
    far = model.pos.embed(tok, 40)  # past the built table: computed from the formula on demand
    torch.testing.assert_close(far, tok * math.sqrt(32) + rope.sinusoidal_table(45, 32)[40:45])
