"""The decoder, over every registered positional scheme: causality, shifts, learning, init, config checks."""

import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import schemes
import spans
from config import weightless
from conftest import all_logits, tiny_model as tiny
from model import GPTConfig, all_schemes
from source import Source, fine_tune_config


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_future_tokens_never_change_earlier_logits(pos_emb):
    model = tiny(pos_emb)
    idx = torch.randint(0, 11, (2, 16))
    changed = idx.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    a, b = all_logits(model, idx), all_logits(model, changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_a_shift_of_all_positions_changes_logits_only_for_schemes_that_are_not_relative(pos_emb):
    # RoPE scores depend on m - n only, ALiBi's bias on the distance: moving the whole sequence changes
    # nothing, which also shows values are not rotated (they would carry absolute positions into the output)
    model = tiny(pos_emb)
    for p in model.scheme.parameters():  # a trained table's scale, not init's 0.02, so a shift shows
        torch.nn.init.normal_(p)
    idx = torch.randint(0, 11, (2, 8))
    shift = 37 if all_schemes()[pos_emb].extrapolates else 16 - 8
    plain, shifted = all_logits(model, idx), all_logits(model, idx, start_pos=shift)
    if not all_schemes()[pos_emb].relative:
        assert not torch.allclose(plain, shifted, atol=1e-4)
    else:
        torch.testing.assert_close(plain, shifted, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", all_schemes())
@pytest.mark.slow
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
    torch.nn.init.normal_(model.scheme.wpe.weight)
    before = model.scheme.wpe.weight.clone()
    with pytest.raises(
        ValueError,
        match="rope_scaling='linear' does nothing for pos_emb='learned'; it applies to pos_emb rope, xpos, rnope",
    ):
        model.reconfigure(rope_scaling="linear", rope_scaling_factor=2.0)
    assert model.config.rope_scaling == "none"
    model.reconfigure(original_len=8)  # an allowed key: the scheme is rebuilt, its table kept
    assert torch.equal(model.scheme.wpe.weight, before) and model.config.original_len == 8
    with pytest.raises(
        ValueError,
        match="n_head cannot change on a built model; only original_len, rope_scaling, "
        "rope_scaling_factor, pos_emb can",
    ):
        model.reconfigure(n_head=1)
    with pytest.raises(ValueError, match="block_size cannot change"):  # weightless, but the modules are built with it
        model.reconfigure(block_size=32)


# ----------------------------------------------------------------------------- settings, each declared once


def test_the_settings_no_weight_depends_on_are_declared_once_and_every_reader_asks_the_declaration():
    assert weightless(GPTConfig) == ("block_size", "dropout", "original_len", "rope_scaling", "rope_scaling_factor")
    source = Source(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, rope_base=500.0), {}, "run", {}, None)
    wanted = GPTConfig(block_size=32, dropout=0.1, rope_scaling="yarn", rope_scaling_factor=2.0, rope_base=500.0)
    tuned = fine_tune_config(source, wanted, {}, "init_from=run")
    changed = [k for k, v in tuned.resolved().items() if v != source.config.resolved()[k]]
    assert changed == ["block_size", "dropout", "rope_scaling", "rope_scaling_factor"]  # every one declared weightless
    assert tuned.original_len == 16  # the source's L0, kept: the context grew past it
    with pytest.raises(
        ValueError, match="init_from=run is another model \\(n_layer: init_from=run has 2, this run 3\\)"
    ):
        fine_tune_config(source, replace(wanted, n_layer=3), {}, "init_from=run")  # a setting at its default is taken


@pytest.mark.parametrize(
    "settings, says",
    [
        (
            {"pos_emb": "sinusoidal", "rope_base": 500.0},
            "rope_base=500.0 does nothing for pos_emb='sinusoidal'; it applies to pos_emb rope, xpos, rnope",
        ),
        ({"pos_emb": "none", "rope_fraction": 0.5}, "rope_fraction=0.5 does nothing for pos_emb='none'"),
        (
            {"pos_emb": "alibi", "rope_scaling": "yarn", "rope_scaling_factor": 2.0},
            "rope_scaling='yarn' does nothing for pos_emb='alibi'",
        ),
        (
            {"pos_emb": "rope", "xpos_scale_base": 8.0},
            "xpos_scale_base=8.0 does nothing for pos_emb='rope'; it applies to pos_emb xpos",
        ),
        (
            {"pos_emb": "xpos", "rnope_window": 4},
            "rnope_window=4 does nothing for pos_emb='xpos'; it applies to pos_emb rnope",
        ),
        (
            {"rope_scaling": "linear", "rope_scaling_factor": 0.0},
            "rope_scaling_factor=0.0 must be a finite number >= 1",
        ),
        ({"rope_scaling_factor": 2.0}, "rope_scaling_factor=2 does nothing without a rope_scaling (linear, ntk"),
        ({"block_size": 16, "original_len": 32}, "original_len=32 (L0) exceeds block_size=16"),
        ({"rope_layout": "diagonal"}, "rope_layout='diagonal' must be one of interleaved, half"),
    ],
)
def test_a_setting_that_does_nothing_or_is_out_of_range_is_refused_where_it_is_declared(settings, says):
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        GPTConfig(**settings)


def test_a_change_of_scheme_returns_what_the_new_one_does_not_take_to_its_defaults():
    rope = GPTConfig(rope_base=200.0, rope_fraction=0.5, rope_scaling="yarn", rope_scaling_factor=2.0, qk_norm=True)
    nope = rope.with_scheme("none")
    assert nope.pos_emb == "none" and nope.qk_norm and (nope.rope_base, nope.rope_fraction) == (10000.0, 1.0)
    assert (nope.rope_scaling, nope.rope_scaling_factor) == ("none", 1.0)
    assert rope.with_scheme("xpos").rope_base == 200.0  # xpos is a RoPE: it takes them
    model = tiny("rope", rope_base=200.0)
    assert model.reconfigure(pos_emb="none").config == tiny("rope", rope_base=200.0).config.with_scheme("none")


def test_length_relative_defaults_read_l0_which_a_longer_block_size_keeps():
    trained = GPTConfig(n_layer=4, n_head=2, n_embd=32, block_size=64)
    longer = replace(trained, block_size=128, original_len=trained.L0)  # a fine-tune's config: L0 kept
    assert (trained.original_len, trained.L0, longer.L0) == (None, 64, 64)  # untyped: known as the default rule
    assert replace(trained, block_size=128).L0 == 128  # resolved where it is read, never filled in
    xpos = [schemes.XPos(c.with_scheme("xpos")).scale for c in (trained, longer)]
    rnope = [schemes.RNoPE(c.with_scheme("rnope")).window(0) for c in (trained, longer)]
    fire = [schemes.FIRE(c.with_scheme("fire")).init_threshold.item() for c in (trained, longer)]
    assert (xpos, rnope, fire) == ([32, 32], [32, 32], [16.0, 16.0])


# ----------------------------------------------------------------------------- recipe options (each off by default)


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_qk_norm_hands_each_scheme_normalised_queries_and_keys_and_keeps_causality(pos_emb, monkeypatch):
    model = tiny(pos_emb, qk_norm=True)
    seen = []
    rotate = model.scheme.rotate
    monkeypatch.setattr(model.scheme, "rotate", lambda qk, *a: seen.append(qk) or rotate(qk, *a))
    idx = torch.randint(0, 11, (2, 16))
    logits = all_logits(model, idx)
    assert len(seen) == 2  # one stack of q and k per block, normalised before the scheme sees them
    for qk in seen:  # gains start at 1: mean 0 and RMS 1 over each head's dims
        torch.testing.assert_close(qk.mean(-1), torch.zeros(qk.shape[:-1]), atol=1e-5, rtol=0)
        # RMS sqrt(var / (var + eps)): a hair under 1 for the small queries of a freshly initialised model
        torch.testing.assert_close(qk.pow(2).mean(-1).sqrt(), torch.ones(qk.shape[:-1]), atol=5e-3, rtol=0)
    changed = idx.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    torch.testing.assert_close(all_logits(model, changed)[:, :9], logits[:, :9])
    gains = {n for n, p in model.named_parameters() if "ln_q" in n or "ln_k" in n}
    assert gains == {f"blocks.{i}.attn.ln_{x}.weight" for i in range(2) for x in "qk"}


def test_relu2_is_relu_squared():
    model = tiny("rope", mlp_act="relu2")
    mlp, x = model.blocks[0].mlp, torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.c_proj(torch.relu(mlp.c_fc(x)) ** 2))
    assert not torch.allclose(mlp(x), tiny("rope").blocks[0].mlp(x))


def test_an_untied_head_has_its_own_weight_and_counts_instead_of_the_token_table():
    tied, untied = tiny("rope"), tiny("rope", tie_embeddings=False)
    assert untied.lm_head.weight is not untied.wte.weight
    assert abs(untied.lm_head.weight.std().item() - 0.02) < 4e-3
    head = 11 * 32  # vocab x n_embd
    assert untied.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + head
    # the token table is a lookup, the head a matmul: either way one vocab x n_embd counts, so the FLOPs agree
    assert untied.num_params() == tied.num_params() and untied.flops_per_token(16) == tied.flops_per_token(16)
    assert torch.equal(untied.wte.weight, tied.wte.weight)  # the head's init comes after every other weight's
    untied.lm_head.weight.data.zero_()
    assert torch.equal(all_logits(untied, torch.randint(0, 11, (1, 5))), torch.zeros(1, 5, 11))


def test_logit_softcap_squashes_logits_in_the_loss_and_in_generation():
    capped, plain = tiny("rope", logit_softcap=2.0), tiny("rope")
    for p in plain.parameters():  # large logits, so the cap bites
        torch.nn.init.normal_(p)
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 11, (2, 16))
    raw, (logits, loss) = all_logits(plain, idx), capped(idx, idx)
    assert raw.abs().max() > 8.0 and logits.abs().max() <= 2.0  # float32's tanh reaches 1 itself
    torch.testing.assert_close(logits, 2.0 * torch.tanh(raw / 2.0))
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), idx.flatten()))
    torch.testing.assert_close(capped(idx)[0], logits[:, -1:])  # generation's forward: the last position, capped


def test_zero_init_proj_starts_every_block_as_the_identity_and_still_learns():
    model = tiny("rope", zero_init_proj=True)
    projections = [b.attn.c_proj.weight for b in model.blocks] + [b.mlp.c_proj.weight for b in model.blocks]
    assert all(not p.any() for p in projections)
    idx = torch.randint(0, 11, (2, 16))
    embedded = model.ln_f(model.wte(idx))  # rope adds nothing to the input: each block passes it through
    torch.testing.assert_close(all_logits(model, idx), model.lm_head(embedded))
    model(idx, idx)[1].backward()
    assert all(p.grad.abs().sum() > 0 for p in projections)


def test_recipe_options_reject_bad_values():
    with pytest.raises(ValueError, match="mlp_act='swish' must be one of gelu, gelu_tanh, relu2"):
        GPTConfig(mlp_act="swish")
    with pytest.raises(ValueError, match="logit_softcap=-1.0 must be a finite number >= 0"):
        GPTConfig(logit_softcap=-1.0)


def test_gelu_tanh_is_gpt2s_approximation_and_the_parallel_residual_reads_one_input():
    model = tiny("rope", mlp_act="gelu_tanh", parallel_residual=True)
    mlp, x = model.blocks[0].mlp, torch.randn(3, 32)
    c = torch.sqrt(torch.tensor(2 / torch.pi))
    h = mlp.c_fc(x)
    torch.testing.assert_close(mlp(x), mlp.c_proj(0.5 * h * (1 + torch.tanh(c * (h + 0.044715 * h**3)))))
    block, x = model.blocks[0], torch.randn(2, 5, 32)
    span = spans.Span(0, 5, 5, "cpu")
    expected = x + block.attn(block.ln_1(x), model.scheme, span, None) + block.mlp(block.ln_2(x))
    torch.testing.assert_close(block(x, model.scheme, span, None), expected)
