"""The ablation's other positional schemes, beside positions.py's RoPE and sinusoidal: learned absolute positions,
ALiBi, NoPE, xPos, KERPLE, FIRE and the RoPE/NoPE hybrid. Each joins positions.SCHEMES by name when this module is
imported, which model.scheme_class does only where a run names one of positions.ELSEWHERE, so a plain RoPE run reads
none of this; their settings are declared in model.GPTConfig.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from positions import RoPE, Scheme, register


@register("learned")
class Learned(Scheme):
    """A trained table of block_size absolute position embeddings (GPT-2); nothing past block_size."""

    relative, extrapolates = False, False
    hf_family = "gpt2"

    def __init__(self, config):
        super().__init__(config)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)

    def fitted(self, state, prefix):
        """The first block_size rows of a longer trained table: a fine-tune at a shorter context keeps the positions
        it still reads."""
        key = prefix + "wpe.weight"
        return state | {key: state[key][: self.config.block_size]}

    def embed(self, tok, span):
        if span.end > self.config.block_size:
            raise ValueError(
                f"position {span.end - 1} is past the learned table (block_size={self.config.block_size}); "
                "learned positions cannot extrapolate"
            )
        return tok + self.wpe(span.ids)

    def embedding_numel(self):
        return self.wpe.weight.numel()


def causal(bias, span):
    """bias (nh, T, S) or (B, nh, T, S) with -inf at the span's future keys."""
    return bias.masked_fill(~span.visible(), float("-inf"))


def alibi_slopes(n_head: int) -> torch.Tensor:
    """(n_head,) float32 ALiBi slopes (Press et al. 2022). For H a power of two: 2^(-8h/H),
    h = 1..H. Otherwise, with 2^k the largest power of two below H: the 2^k slopes of that
    sequence, then every other slope (h = 1, 3, 5, ...) of the 2^(k+1) sequence for the rest."""
    if not (isinstance(n_head, int) and n_head >= 1):
        raise ValueError(f"n_head={n_head!r} must be a positive int")

    def geometric(n):  # 2^(-8h/n), h = 1..n
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)

    k = 1 << (n_head.bit_length() - 1)  # largest power of two <= n_head
    return torch.cat((geometric(k), geometric(2 * k)[0::2][: n_head - k])).float()


@register("alibi")
class ALiBi(Scheme):
    """Attention with linear biases (Press et al. 2022): no embedding, each head's scores lowered in proportion
    to the distance, with its own slope."""

    hf_lacks = "ALiBi's per-head linear score biases"

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def bias(self, span, layer):
        return causal(-self.slopes[:, None, None] * span.distances(), span)  # (nh, T, S): -slope * (m - n)


@register("none")
class NoPE(Scheme):
    """No positional information (NoPE, Kazemnejad et al. 2023): the causal mask alone lets a decoder count."""

    reads_positions = False
    hf_family = "rotary"  # with no rotary dims


def pairwise(per_pair, layout, head_dim, fill):
    """(rot/2,) values per rotated pair -> (head_dim,) per dim, in the pairing of layout; the dims past the
    rotated ones (partial rotary) get fill."""
    per_dim = per_pair.repeat_interleave(2) if layout == "interleaved" else torch.cat((per_pair, per_pair))
    return torch.cat((per_dim, per_dim.new_full((head_dim - len(per_dim),), fill)))


@register("xpos")
class XPos(RoPE):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE with queries at position m scaled
    per pair by zeta_i^(m/B) and keys at n by zeta_i^(-n/B), zeta_i = (2i/d + 0.4)/1.4 for pair i = 0..d/2-1, so
    a score carries zeta_i^((m - n)/B) and decays with distance, fastest in the fast pairs. Positions start at
    0 (the reference code centres them, which a KV cache would break).

    The rule relative to L0: B = L0 / 2, the paper's 512 at its training length of 1,024, so the fastest pair's
    decay across the trained context is zeta_0^2 = 0.08 and the mechanism acts in training (B = 512 at L0 = 64
    left it at 0.86: xPos was RoPE in context). Past L0 it attends blockwise, as its paper evaluates it: each
    query sees the last block_size keys (torchscale's window at decoding), never a distance it was not trained at."""

    hf_lacks = "xPos's distance decay of queries and keys"

    def __init__(self, config):
        super().__init__(config)
        half = self.rot_dim // 2
        zeta = (2 * torch.arange(half, dtype=torch.float64) / self.rot_dim + 0.4) / 1.4  # (rot/2,)
        log_zeta = pairwise(zeta.log(), config.rope_layout, config.head_dim, fill=0.0)  # (hs,)
        self.register_buffer("log_zeta", log_zeta.float(), persistent=False)
        # B: xpos_scale_base, else L0 / 2 (the paper's ratio); once, as a scheme is rebuilt when its config changes
        self.scale = config.xpos_scale_base or config.L0 / 2

    def rotate(self, qk, span, layer):
        q, k = super().rotate(qk, span, layer)  # (B, nh, T, hs) each
        m = span.ids.float()[..., None]  # (T, 1) or (B, T, 1)
        scale = span.heads((m / self.scale * self.log_zeta).exp())  # (T, hs): zeta^(m/B) per dim
        return torch.stack((q * scale, k / scale)).to(qk.dtype)

    def window(self, layer):
        return self.config.block_size


def per_layer(n_layer, *shape):
    """One parameter of shape per layer: vectors stay vectors, so the optimizer does not decay them."""
    return nn.ParameterList(nn.Parameter(torch.empty(shape)) for _ in range(n_layer))


@register("kerple")
class Kerple(Scheme):
    """KERPLE with its logarithmic kernel (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding
    for Length Extrapolation"): each head of each layer adds -r1 * log(1 + r2 * (m - n)) to its scores,
    r1, r2 > 0 learned. They start as the authors' code draws them, per head: r1 ~ U(0, 2), r2 ~ U(0, 1) (at least
    0.01, the authors' clamp), so heads start at different ranges; here r = softplus of a free parameter keeps
    them positive with a gradient everywhere (the authors clamp). Nothing depends on L0."""

    hf_lacks = "KERPLE's learned logarithmic score biases"

    def __init__(self, config):
        super().__init__(config)
        self.r1, self.r2 = per_layer(config.n_layer, config.n_head), per_layer(config.n_layer, config.n_head)

    def init_parameter(self, name, p):
        high = 2.0 if name.startswith("r1") else 1.0
        r = torch.empty_like(p).uniform_(0.01, high)
        with torch.no_grad():
            p.copy_(r + torch.log(-torch.expm1(-r)))  # softplus^-1(r)

    def bias(self, span, layer):
        r1, r2 = (F.softplus(r[layer]).float()[:, None, None] for r in (self.r1, self.r2))  # (nh, 1, 1) each
        return causal(-r1 * torch.log1p(r2 * span.distances().clamp(min=0)), span)  # (nh, T, S)


@register("fire")
class FIRE(Scheme):
    """FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers"): each layer adds f(psi(m - n) / psi(max(m, L))) to its scores, psi(x) = log(c x + 1), f a
    small MLP (1 -> 32 -> n_head, ReLU), c > 0 and the threshold L learned per layer. Below L the bias is a function
    of the distance alone; past it the distance is normalised by the query's position (progressive
    interpolation), so every input stays in [0, 1] at any length, and scores are not relative.

    As the reference code: L = |a * L_init| with a learned multiplier a starting at 1, c starting at 0.1. The rule
    relative to L0: L_init = L0 / 4 (the reference's 512 at a training length of 2,048), so L lies well below the
    longest training position and the interpolation acts in training, not only past L0."""

    HIDDEN = 32
    relative = False
    hf_lacks = "FIRE's learned function of normalised distances"

    def __init__(self, config):
        super().__init__(config)
        nl, h = config.n_layer, self.HIDDEN
        self.w1, self.b1 = per_layer(nl, h, 1), per_layer(nl, h)  # the MLP's layers, as nn.Linear holds them
        self.w2, self.b2 = per_layer(nl, config.n_head, h), per_layer(nl, config.n_head)
        self.c, self.multiplier = per_layer(nl), per_layer(nl)
        self.register_buffer("init_threshold", torch.tensor(config.L0 / 4), persistent=False)

    def init_parameter(self, name, p):
        kind = name.partition(".")[0]
        if kind == "c":
            nn.init.constant_(p, math.log(math.expm1(0.1)))  # softplus^-1(0.1)
        elif kind == "multiplier":
            nn.init.ones_(p)
        else:  # as nn.Linear starts, U(-1/sqrt(fan_in), 1/sqrt(fan_in)): the input is one number, the hidden 32
            bound = 1.0 if kind in ("w1", "b1") else 1 / math.sqrt(self.HIDDEN)
            nn.init.uniform_(p, -bound, bound)

    def threshold(self, layer):
        return (self.multiplier[layer].float() * self.init_threshold).abs()

    def bias(self, span, layer):
        dist = span.ids[..., :, None] - span.key_ids[..., None, :]  # (T, S) or (B, T, S)
        c, L = F.softplus(self.c[layer]).float(), self.threshold(layer)
        m = span.ids.float()[..., None]  # (T, 1) or (B, T, 1)
        x = torch.log1p(c * dist.clamp(min=0)) / torch.log1p(c * torch.maximum(m, L))  # (..., T, S) in [0, 1]
        hidden = F.relu(F.linear(x[..., None], self.w1[layer].float(), self.b1[layer].float()))  # (..., T, S, 32)
        bias = F.linear(hidden, self.w2[layer].float(), self.b2[layer].float()).movedim(-1, -3)  # (..., nh, T, S)
        return causal(bias, span)


@register("rnope")
class RNoPE(RoPE):
    """RoPE and NoPE interleaved (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention
    Strategy"): the last layer of every nope_every has no positional information and full attention, the others
    RoPE with sliding-window attention (RNoPE-SWA, the paper's proposal). The rule relative to L0: the window is
    rnope_window keys, by default L0 / 2 (the paper's 4,096 at its 8,192-token training length)."""

    hf_lacks = "layers without RoPE among layers with it (GPT-NeoX rotates in every layer)"

    def __init__(self, config):
        super().__init__(config)
        # the sliding window: rnope_window, else L0 / 2; once, as a scheme is rebuilt when its config changes
        self.swa_window = config.rnope_window or max(1, config.L0 // 2)

    def nope(self, layer):
        return (layer + 1) % self.config.nope_every == 0

    def rotate(self, qk, span, layer):
        return qk if self.nope(layer) else super().rotate(qk, span, layer)

    def window(self, layer):
        return None if self.nope(layer) else self.swa_window
