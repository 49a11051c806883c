"""The registry of positional schemes: one class per `pos_emb` value.

A scheme may add position to three places of the decoder, and each class says which:

* `embed(tok, offset)`: the input embedding of token embeddings at positions offset.. (sinusoidal, learned);
* `rotate(qk, offset)`: a transform of queries and keys stacked (2, B, nh, T, hs) (rope);
* `bias(T, S, past)`: an additive attention-score bias (nh, T, S) with the causal mask built in, for T
  queries after `past` cached keys (alibi); None leaves attention plainly causal.

Class attributes say the rest: `extrapolates` (whether it runs past block_size at all), `scalings`
(the `rope_scaling` values it takes at evaluation or sampling time, which `GPT.reconfigure` switches
through the config), and `check(config)` for what the config must satisfy. Adding a scheme is one class
here plus its tests: the config's choices, the ablation grid and every generic test read `SCHEMES`.

RoPE's maths is in rope.py; the other schemes' maths (sinusoidal table, ALiBi slopes and bias) is here.
"""

import math

import torch
import torch.nn as nn

import rope

SCHEMES = {}  # pos_emb name -> scheme class, in the order of the tables


def register(name):
    def add(cls):
        assert name not in SCHEMES, f"positional scheme {name!r} is registered twice"
        cls.name = name
        SCHEMES[name] = cls
        return cls
    return add


def scheme(name):
    """The scheme class registered as name, or a ValueError listing the valid ones."""
    if name not in SCHEMES:
        raise ValueError(f"pos_emb={name!r} is unknown; choose one of {', '.join(SCHEMES)}")
    return SCHEMES[name]


class Scheme(nn.Module):
    """The interface every scheme implements; this base adds nothing, and each scheme overrides what it adds."""

    name = None  # set by register
    extrapolates = True  # it can read positions past block_size
    scalings = ()  # the values rope_scaling may take on a built model (GPT.reconfigure); () if it has none
    attn_factor = 1.0  # multiplier of the softmax scale

    def __init__(self, config):
        super().__init__()
        self.config = config

    @classmethod
    def check(cls, config):
        """Raise ValueError for a config this scheme cannot build."""

    def embed(self, tok, offset):
        """Token embeddings tok (B, T, C) at positions offset..offset+T-1 -> the input (B, T, C)."""
        return tok

    def rotate(self, qk, offset):
        """Queries and keys stacked (2, B, nh, T, hs) at positions offset.. -> the same shape."""
        return qk

    def bias(self, q_len, k_len, past):
        """(nh, q_len, k_len) float scores added in attention, -inf where a key is in a query's future, for
        q_len queries after past cached keys; None for plain causal attention."""
        return None

    def reserve(self, n):
        """Make any table cover positions [0, n) before compiled code reaches them."""

    def embedding_numel(self):
        """Parameters of a position table: the non-embedding parameter count leaves them out, as nanoGPT's wpe."""
        return 0


@register("rope")
class RoPE(Scheme):
    """Rotary position embedding (Su et al., RoFormer, eq. 14-15): queries and keys turned by R(m), never values;
    the maths, tables and context-extension scalings are rope.py's."""

    scalings = tuple(rope.SCALINGS)

    def __init__(self, config):
        super().__init__(config)
        self.rotary = rope.Rotary(config.head_dim, config.rope_base, config.rope_fraction, config.rope_layout,
                                  config.rope_scaling, config.rope_scaling_factor,
                                  original_len=config.block_size, max_len=config.block_size)

    @classmethod
    def check(cls, config):
        rotated = int(config.head_dim * config.rope_fraction)
        if rotated % 2:
            raise ValueError(f"RoPE rotates pairs of dims, but head size n_embd/n_head={config.head_dim} times "
                             f"rope_fraction={config.rope_fraction} gives {rotated} rotated dims; choose them so "
                             "this is even")

    @property
    def attn_factor(self):
        """YaRN's attention temperature, else 1."""
        return self.rotary.attn_factor

    def rotate(self, qk, offset):
        return self.rotary(qk, offset)  # one call turns queries and keys together

    def reserve(self, n):
        self.rotary.reserve(n)


def sinusoidal_table(n_pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """(n_pos, d) float32 absolute encodings of "Attention Is All You Need":
    PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)): RoPE's angles, added."""
    if not (isinstance(d, int) and d > 0 and d % 2 == 0):
        raise ValueError(f"d={d!r} must be a positive even int: sin and cos fill pairs of dims")
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (n_pos, d/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float()  # (n_pos, d/2, 2) -> (n_pos, d)


@register("sinusoidal")
class Sinusoidal(Scheme):
    """Fixed sinusoids added to the input (Vaswani et al. 2017, section 3.5); the formula reaches any position."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("sinusoid", sinusoidal_table(config.block_size, config.n_embd), persistent=False)

    @classmethod
    def check(cls, config):
        if config.n_embd % 2:
            raise ValueError(f"n_embd={config.n_embd} must be even for sinusoidal embeddings")

    def embed(self, tok, offset):
        end = offset + tok.shape[1]
        # past the built table the rows are computed from the formula on demand
        table = self.sinusoid if end <= len(self.sinusoid) else sinusoidal_table(end, tok.shape[2]).to(tok.device)
        # as in the paper, token embeddings are scaled by sqrt(d) before the +-1 table is added; unscaled
        # (std 0.02) they would be drowned by it and sinusoidal would lose any short ablation
        return tok * math.sqrt(tok.shape[2]) + table[offset:end].to(tok.dtype)


@register("learned")
class Learned(Scheme):
    """A trained table of block_size absolute position embeddings (GPT-2); nothing past block_size."""

    extrapolates = False

    def __init__(self, config):
        super().__init__(config)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)

    def embed(self, tok, offset):
        end = offset + tok.shape[1]
        if end > self.config.block_size:
            raise ValueError(f"position {end - 1} is past the learned table (block_size={self.config.block_size}); "
                             "learned positions cannot extrapolate")
        return tok + self.wpe(torch.arange(offset, end, device=tok.device))

    def embedding_numel(self):
        return self.wpe.weight.numel()


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


def alibi_bias(slopes: torch.Tensor, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
    """(H, q_len, k_len) float32 additive attention bias with the causal mask built in: query i
    sits at position offset + i, key j at j; bias = -slope * (q_pos - k_pos) for k_pos <= q_pos,
    -inf for future keys."""
    if offset < 0:
        raise ValueError(f"offset={offset} must be >= 0")
    q_pos = torch.arange(offset, offset + q_len, device=slopes.device)
    k_pos = torch.arange(k_len, device=slopes.device)
    rel = (k_pos[None, :] - q_pos[:, None]).float()  # (q_len, k_len): <= 0 for visible keys
    bias = slopes.float()[:, None, None] * rel  # (H, q_len, k_len)
    return bias.masked_fill(rel > 0, float("-inf"))


@register("alibi")
class ALiBi(Scheme):
    """Attention with linear biases (Press et al. 2022): no embedding, each head's scores lowered in proportion
    to the distance, with its own slope."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def bias(self, q_len, k_len, past):
        return alibi_bias(self.slopes, q_len, k_len, past)


@register("none")
class NoPE(Scheme):
    """No positional information (NoPE, Kazemnejad et al. 2023): the causal mask alone lets a decoder count."""
