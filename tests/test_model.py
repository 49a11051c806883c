"""The decoder, over every registered positional scheme: causality, shifts, learning, init, config checks."""

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


@pytest.mark.parametrize("pos_emb", positions.SCHEMES)
def test_a_shift_of_all_positions_changes_logits_only_for_schemes_that_are_not_relative(pos_emb):
    # RoPE scores depend on m - n only, ALiBi's bias on the distance: moving the whole sequence changes
    # nothing, which also shows values are not rotated (they would carry absolute positions into the output)
    model = tiny(pos_emb)
    for p in model.pos.parameters():  # a trained table's scale, not init's 0.02, so a shift shows
        torch.nn.init.normal_(p)
    idx = torch.randint(0, 11, (2, 8))
    shift = 37 if positions.SCHEMES[pos_emb].extrapolates else 16 - 8
    plain, shifted = all_logits(model, idx), all_logits(model, idx, start_pos=shift)
    if not positions.SCHEMES[pos_emb].relative:
        assert not torch.allclose(plain, shifted, atol=1e-4)
    else:
        torch.testing.assert_close(plain, shifted, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", positions.SCHEMES)
def test_model_overfits_one_batch(pos_emb):
    model = tiny(pos_emb).train()
    idx = torch.randint(0, 11, (4, 16))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(300):  # a scheme without positions leaves its plateau at a chaotic step: keep a margin
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


def test_reconfigure_changes_the_config_and_matches_a_model_built_with_it():
    model = tiny("rope")
    idx = torch.randint(0, 11, (1, 40))  # past block_size 16, where the scaling matters
    model.reconfigure(rope_scaling="yarn", rope_scaling_factor=4.0)
    assert (model.config.rope_scaling, model.config.rope_scaling_factor) == ("yarn", 4.0)
    built = tiny("rope", rope_scaling="yarn", rope_scaling_factor=4.0)  # same seed: same weights
    torch.testing.assert_close(all_logits(model, idx), all_logits(built, idx), atol=0, rtol=0)
    model.reconfigure(rope_scaling="none", rope_scaling_factor=1.0)
    torch.testing.assert_close(all_logits(model, idx), all_logits(tiny("rope"), idx), atol=0, rtol=0)


def test_reconfigure_keeps_trained_position_parameters_and_refuses_what_weights_depend_on():
    model = tiny("learned")
    torch.nn.init.normal_(model.pos.wpe.weight)
    before = model.pos.wpe.weight.clone()
    with pytest.raises(ValueError, match="rope_scaling='linear' does not apply to pos_emb='learned'"):
        model.reconfigure(rope_scaling="linear", rope_scaling_factor=2.0)
    assert model.config.rope_scaling == "none"
    model.reconfigure(rope_scaling_factor=1.0)  # an allowed key: the scheme is rebuilt, its table kept
    assert torch.equal(model.pos.wpe.weight, before)
    with pytest.raises(ValueError, match="n_head cannot change on a built model"):
        model.reconfigure(n_head=1)
