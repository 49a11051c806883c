"""optim.py: our Muon against torch.optim.Muon and against an SVD, the parameter split, the precision choice."""

import pytest
import torch

import optim
from conftest import tiny_model
from data.loader import Batch
from runtime import Runtime
from train import TrainConfig, train_step


def quintic_steps(s, steps):
    """The scalar map Newton-Schulz applies to each normalised singular value, iterated in float64."""
    a, b, c = optim.NS_COEFFICIENTS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_newton_schulz_maps_each_singular_value_through_the_quintic(shape):
    g = torch.randn(3, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = optim.newton_schulz(g, 5, torch.float64)
    for gi, oi in zip(g, out, strict=True):
        u, s, vh = torch.linalg.svd(gi, full_matrices=False)
        expected = quintic_steps(s / gi.norm(), 5)  # Frobenius-normalised, then the polynomial five times
        # U p(S) V^T: the singular vectors are kept, each singular value goes through p alone
        torch.testing.assert_close(oi, u @ torch.diag(expected) @ vh, rtol=0, atol=1e-10)


def test_newton_schulz_leaves_rectangular_gradients_nearly_orthogonal():
    """Singular values end in the quintic's band around 1 (about 0.7 to 1.2), the "semi-orthogonal" update."""
    g = torch.randn(8, 128, 384, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    s = torch.linalg.svdvals(optim.newton_schulz(g, 5, torch.float64))
    assert s.min() > 0.68 and s.max() < 1.2, (s.min().item(), s.max().item())
    before = torch.linalg.svdvals(g)
    assert (before.max(-1).values / before.min(-1).values).min() > 3  # the input was far from orthogonal


def muon_pair(ns_dtype, weight_decay=0.1):
    """Two identical sets of matrices (tall, wide, square) with the same gradients, one for each Muon."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(96, 32), (32, 96), (32, 32), (32, 32)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = dict(lr=0.02, momentum=0.95, weight_decay=weight_decay)
    return ours, theirs, optim.Muon(ours, ns_dtype=ns_dtype, **kw), torch.optim.Muon(theirs, **kw), gen


def test_muon_in_bf16_steps_as_torch_optim_muon_does():
    ours, theirs, ours_opt, theirs_opt, gen = muon_pair(torch.bfloat16)
    for _ in range(3):  # momentum carries over: later steps test the buffer too
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        before = [p.detach().clone() for p in ours]
        ours_opt.step()
        theirs_opt.step()
        for p, q, b in zip(ours, theirs, before, strict=True):
            # within bf16's rounding (2^-8 of each entry) of each other; the float32 iteration differs from either
            # by about 1.4%, so this tells the precisions apart
            mine, ref = p.detach() - b, q.detach() - b
            assert (mine - ref).norm() <= 2**-8 * ref.norm()
    assert ours_opt.state_dict()["state"][0].keys() == theirs_opt.state_dict()["state"][0].keys()


def test_muon_in_float32_is_closer_to_the_exact_update_than_bf16():
    updates = {}
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        ps, _, opt, _, gen = muon_pair(dtype, weight_decay=0.0)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)
        before = [p.detach().clone() for p in ps]
        opt.step()
        updates[dtype] = torch.cat([(p.detach() - b).flatten() for p, b in zip(ps, before, strict=True)])
    err = {d: (updates[d] - updates[torch.float64]).abs().max().item() for d in (torch.float32, torch.bfloat16)}
    assert err[torch.float32] < 1e-6 < 1e-4 < err[torch.bfloat16], err


def test_split_orthogonalises_each_block_as_a_matrix_of_its_own():
    gen = torch.Generator().manual_seed(2)
    fused = torch.nn.Parameter(torch.zeros(96, 32, dtype=torch.float64))
    fused.grad = torch.randn(96, 32, dtype=torch.float64, generator=gen)
    optim.Muon([{"params": [fused], "split": 3}], lr=1.0, momentum=0.0, ns_dtype=torch.float64).step()
    blocks = optim.newton_schulz(fused.grad.view(3, 32, 32), 5, torch.float64)  # square blocks: lr adjustment 1
    torch.testing.assert_close(fused.detach(), -blocks.reshape(96, 32))


@pytest.mark.parametrize("shape, split", [((8,), 1), ((2, 3, 4), 1), ((10, 4), 3)])
def test_muon_refuses_what_it_cannot_orthogonalise_in_one_line(shape, split):
    with pytest.raises(ValueError, match=r"Muon orthogonalises matrices, but a parameter has shape .*AdamW"):
        optim.Muon([{"params": [torch.nn.Parameter(torch.zeros(shape))], "split": split}], lr=0.02)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest_each_on_the_schedule():
    model = tiny_model("fire", qk_norm=True, tie_embeddings=False)  # FIRE: 2-D positional parameters, for AdamW
    train_cfg = TrainConfig(optimizer="muon", learning_rate=1e-3, muon_lr=0.03, muon_momentum=0.9)
    runtime = Runtime("cpu", torch.float32, False)
    optimizer, _ = optim.make_optimizer(model, train_cfg, runtime)
    names = {p: n for n, p in model.named_parameters()}
    muon, adamw = optimizer.optimizers["muon"], optimizer.optimizers["adamw"]
    (matrices,) = muon.param_groups
    assert {names[p] for p in matrices["params"]} == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    assert matrices["momentum"] == 0.9 and matrices["weight_decay"] == 0.0
    decay, no_decay = ({names[p] for p in g["params"]} for g in adamw.param_groups)
    assert {"wte.weight", "lm_head.weight", "scheme.w1.0", "scheme.w2.1"} <= decay
    assert {"ln_f.weight", "blocks.0.attn.ln_q.weight", "scheme.c.0"} <= no_decay
    assert len(decay | no_decay) + len(matrices["params"]) == len(names)
    x = torch.randint(0, 11, (2, 16))
    before = {n: p.clone() for n, p in model.named_parameters()}
    train_step(model.train(), optimizer, torch.amp.GradScaler("cpu", enabled=False), [Batch(x, x)], 5e-4, 1.0, runtime)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.015), 5e-4, 5e-4]  # muon_lr x 5e-4 / 1e-3
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert type(optim.make_optimizer(model, TrainConfig(), runtime)[0]) is torch.optim.AdamW  # the default


@pytest.mark.parametrize(
    "dtype, ns_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)],
)
def test_newton_schulz_runs_in_the_runs_precision(dtype, ns_dtype):
    optimizer, _ = optim.make_optimizer(tiny_model("rope"), TrainConfig(optimizer="muon"), Runtime("cpu", dtype, False))
    assert optimizer.optimizers["muon"].ns_dtype == ns_dtype


def test_muon_steps_under_float16_loss_scaling():
    model = tiny_model("rope").train()
    runtime = Runtime("cpu", torch.float16, False)
    optimizer, scaler = optim.make_optimizer(model, TrainConfig(optimizer="muon"), runtime)
    assert scaler.is_enabled()
    x = torch.randint(0, 11, (2, 16))
    weight = model.blocks[0].attn.c_attn.weight
    before = weight.clone()
    loss, _ = train_step(model, optimizer, scaler, [Batch(x, x)], 1e-3, 1.0, runtime)
    assert torch.isfinite(loss) and not torch.equal(weight, before)
    scaler.update(1e38)  # a scale that overflows float16: the scaler must skip both optimizers' step
    before = {n: p.clone() for n, p in model.named_parameters()}
    train_step(model, optimizer, scaler, [Batch(x, x)], 1e-3, 1.0, runtime)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert scaler.get_scale() < 1e38
