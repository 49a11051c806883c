"""What a trained scheme does inside, for readers of the ablation: each head's attention (its mean distance and
entropy over fixed validation windows) and the learned score biases of Kerple and FIRE against distance."""

import contextlib
import math

import torch

import model as model_module
import positions
import spans


def weights(q, k, mask, is_causal, scale):
    """The attention probabilities (B, nh, T, S) that scaled_dot_product_attention uses for these arguments."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, nh, T, S)
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(-1)


@contextlib.contextmanager
def recorded_attention():
    """While entered, every attention of every model also records its probabilities, in the order the layers run."""
    seen, original = [], model_module.attention

    def recording(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None):
        seen.append(weights(q, k, mask, is_causal, scale))
        return original(q, k, v, mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)

    model_module.attention = recording
    try:
        yield seen
    finally:
        model_module.attention = original


@torch.no_grad()
def attention_stats(model, batches, runtime):
    """{"distance": [layer][head], "entropy": [layer][head]}: the mean distance (query position minus key position,
    weighted by attention) and the entropy (nats) of each head's attention over batches' fixed validation windows."""
    n_layer, totals, n = model.config.n_layer, None, 0
    for x, _ in batches.eval_batches("val"):  # (B, T)
        with recorded_attention() as seen, runtime.autocast():
            model(x)
        T = x.shape[1]
        dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float().to(x.device)  # (T, T)
        per_layer = [(p * dist).sum(-1).mean((0, 2)) for p in seen[:n_layer]]  # (nh,) each
        entropy = [-(p * p.clamp(min=1e-12).log()).sum(-1).mean((0, 2)) for p in seen[:n_layer]]
        batch = torch.stack((torch.stack(per_layer), torch.stack(entropy)))  # (2, n_layer, nh)
        totals = batch if totals is None else totals + batch
        n += 1
    distance, entropy = (totals / n).tolist()
    return {"distance": distance, "entropy": entropy, "uniform_entropy": math.log(batches.block_size / 2)}


@torch.no_grad()
def bias_curves(model, reach):
    """{layer: [head][distance 0..reach-1]}: the score bias a query at position reach - 1 gives each key by its
    distance, for a scheme that learns one (Kerple, FIRE); None for the others."""
    scheme = model.scheme
    if type(scheme).bias is positions.Scheme.bias:
        return None
    span = spans.Span(reach - 1, 1, reach, model.wte.weight.device)
    return {
        layer: scheme.bias(span, layer)[:, 0].flip(-1).tolist()  # (nh, reach): distance 0 first
        for layer in range(model.config.n_layer)
    }
