"""The optimizers: AdamW, and Muon on the blocks' matrices with AdamW on the rest, in the run's precision.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks") is SGD with Nesterov
momentum whose update is replaced by the nearest semi-orthogonal matrix, approximated by a few steps of a
quintic Newton-Schulz iteration. torch.optim.Muon runs that iteration in bf16 whatever the run's dtype; on a
CPU without native bf16 (AVX2 only, most laptops) a bf16 matmul is emulated, ~70x slower than float32's, so
a float32 run would spend minutes in it. Ours runs it in the precision the run computes in.
"""

import math
from collections import defaultdict

import torch

OPTIMIZERS = ("adamw", "muon")
# Keller Jordan's quintic p(s) = a s + b s^3 + c s^5: the largest slope at 0 (a) that still leaves every
# singular value in [0, 1] near 1 after five steps. It does not converge to exactly 1: singular values end in
# a band around it (about 0.7 to 1.2), which trains as well as the exact orthogonal factor
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7  # keeps a zero update's normalisation finite


def newton_schulz(g, steps, dtype):
    """Approximately orthogonalise each matrix of g (n, r, c): U S' V^T for g = U S V^T, S' within the band of
    NS_COEFFICIENTS, computed in dtype, all n in one batched iteration."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the wide side: the Gram matrix x x^T is then the smaller one
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)  # spectral norm <= Frobenius norm = 1
    for _ in range(steps):
        gram = x @ x.mT  # (n, r, r)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a x + (b G + c G^2) x: p applied to each singular value
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    """Muon on 2-D parameters: momentum buffer B = mu B + (1 - mu) g, Nesterov update (1 - mu) g + mu B, made
    semi-orthogonal by newton_schulz in ns_dtype, scaled by lr * sqrt(max(1, rows/cols)) (Keller Jordan's
    adjustment, torch.optim.Muon's default), with decoupled weight decay. Matrices of one shape are
    orthogonalised together in one batched iteration. A group's `split` (default 1) cuts each of its matrices
    into that many row blocks, each orthogonalised (and lr-adjusted) as a matrix of its own, e.g. q, k and v
    inside one fused projection.

    ns_dtype is the run's precision, not a hyperparameter: it is not saved, so a run resumed on another machine
    computes in that machine's precision. State and group keys are torch.optim.Muon's, whose checkpoints load."""

    def __init__(self, params, lr, momentum=0.95, weight_decay=0.0, ns_steps=5, ns_dtype=torch.float32):
        super().__init__(
            params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, ns_steps=ns_steps, nesterov=True, split=1)
        )
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2 or p.shape[0] % group["split"]:
                    raise ValueError(
                        f"Muon orthogonalises matrices, but a parameter has shape {tuple(p.shape)}"
                        f"{' with split=' + str(group['split']) if group['split'] > 1 else ''}; "
                        "give it to AdamW instead"
                    )

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            mu, split = group["momentum"], group.get("split", 1)
            blocks = defaultdict(list)  # block shape -> [(param, its update's blocks (split, r, c))]
            for p in params:
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu).view(split, p.shape[0] // split, p.shape[1])  # (split, r, c)
                blocks[update.shape[1:]].append((p, update))
            for (rows, cols), members in blocks.items():
                ortho = newton_schulz(torch.cat([u for _, u in members]), group["ns_steps"], self.ns_dtype)
                lr = group["lr"] * math.sqrt(max(1.0, rows / cols))
                for (p, _), o in zip(members, ortho.split(split), strict=True):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(o.view_as(p), alpha=-lr)


class Optimizers:
    """Several torch optimizers that train_step, the GradScaler and the checkpoint treat as one: their param_groups
    in one list, one step, one zero_grad, one state dict (keyed by name)."""

    def __init__(self, **optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):
        return [group for o in self.optimizers.values() for group in o.param_groups]

    def step(self):
        for o in self.optimizers.values():
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: o.state_dict() for name, o in self.optimizers.items()}

    def load_state_dict(self, state):
        for name, o in self.optimizers.items():
            o.load_state_dict(state[name])


def muon_precision(runtime):
    """Newton-Schulz's dtype: bf16 where the run computes in bf16 (its matmuls are then fast here), else float32."""
    return torch.bfloat16 if runtime.dtype == torch.bfloat16 else torch.float32


def make_optimizer(model, train_cfg, runtime):
    """The optimizer (train_cfg.optimizer) and the gradient scaler that float16 needs (a pass-through in other dtypes):
    every step uses both.

    AdamW: matrices decay, vectors (biases, norm gains) do not; the fused kernel (one pass over each parameter
    instead of a dozen foreach ops) on CUDA and on CPU alike. Muon: the 2-D weights inside the blocks, in the
    run's precision (muon_precision), everything else to that AdamW; the two as one Optimizers, Muon's group
    stepping at muon_lr / learning_rate times the schedule's lr (its lr_scale)."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    on_muon = {
        name: train_cfg.optimizer == "muon" and name.startswith("blocks.") and p.dim() == 2 for name, p in params
    }
    matrices = [
        p for name, p in params if on_muon[name] and not (train_cfg.muon_split_qkv and name.endswith("c_attn.weight"))
    ]
    qkv = [p for name, p in params if on_muon[name] and train_cfg.muon_split_qkv and name.endswith("c_attn.weight")]
    rest = [p for name, p in params if not on_muon[name]]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": train_cfg.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    adamw = torch.optim.AdamW(
        groups,
        lr=train_cfg.learning_rate,
        betas=(train_cfg.beta1, train_cfg.beta2),
        fused=runtime.device_type in ("cuda", "cpu") or None,
    )
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=runtime.dtype == torch.float16)
    if train_cfg.optimizer == "adamw":
        return adamw, scaler
    scale = train_cfg.muon_lr / train_cfg.learning_rate
    muon = Muon(
        [{"params": matrices, "lr_scale": scale}] + ([{"params": qkv, "lr_scale": scale, "split": 3}] if qkv else []),
        lr=train_cfg.muon_lr,
        momentum=train_cfg.muon_momentum,
        weight_decay=train_cfg.muon_weight_decay,
        ns_steps=train_cfg.muon_ns_steps,
        ns_dtype=muon_precision(runtime),
    )
    return Optimizers(muon=muon, adamw=adamw), scaler
