"""The decoder: causality, what each positional scheme does to it, the KV cache, sampling controls."""


import pytest
import torch

import positions
from conftest import all_logits
from conftest import tiny_model as tiny
from model import GPTConfig


@pytest.mark.parametrize("pos_emb", positions.SCHEMES)
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


@pytest.mark.parametrize("pos_emb", positions.SCHEMES)
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


