"""The registry of positional schemes: one class per `pos_emb` value.

A scheme may add position to three places of the decoder, and each class says which:

* `embed(tok, span)`: the input embedding of token embeddings at the span's positions (sinusoidal, learned);
* `rotate(qk, span, layer)`: a transform of queries and keys stacked (2, B, nh, T, hs) (rope, xpos);
* `bias(span, layer)`: an additive attention-score bias (nh, T, S) with the causal mask built in, for the span's
  T queries and S keys (alibi, kerple, fire); None leaves attention plainly causal.
The last two get the block's index, so a scheme may differ from layer to layer (rnope) or learn per layer. A
`Span` says where a forward's queries sit and which keys they see, whether in training, after a KV cache's
tokens, or in a static-shape decoding step; schemes read positions from it and never ask which.

Class attributes say the rest: `relative` (scores depend on m - n alone), `extrapolates` (whether it runs
past block_size at all), `settings` (its own, declared as any other: model.GPTConfig gathers them as flat keys,
refused for the schemes that do not take them, i.e. other than this class and its subclasses), and what the
transformers architectures of hf.py make of it; `check(config)` says what the config must satisfy,
`init_parameter` how the scheme's own parameters start and `fitted` how a trained state fits it. A default
relative to L0 is a method of the scheme that reads it. Adding a scheme is one class here plus its tests: the
config's choices and settings, the ablation grid and every generic test read `SCHEMES`.

RoPE's maths is in rope.py (p-RoPE's too: it is a RoPE option); the other schemes' maths is here.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import rope
from config import POSITIVE, SHARE, one_of, opt

SCHEMES = {}  # pos_emb name -> scheme class, in the order of the tables


class Span:
    """Where one forward's T queries sit and which S keys they attend to: what the schemes and the attention mask
    read of positions.

    Tokens have an index (their place in the sequence, which alone decides causality) and a position (what the
    schemes encode). By default they are the same, shared by every row: `ids` (T,), `key_ids` (S,). A batch may
    give each row positions of its own (PoSE's skipped ids, packed documents), increasing along the row: then
    `ids` is (B, T) and `key_ids` (B, S), and every position-dependent tensor a scheme builds gets a head axis
    (`heads`) to broadcast over (B, nh, T, S).

    Without a cache or with a dynamic one, `start` is an int and the keys end at the last query (S = T without a
    cache; the cached keys and the T new ones with it). In a static-shape decoding step (generate.StaticKVCache,
    for CUDA graphs) `start` is a 0-dim tensor that no host code may read, and the keys are the cache's S fixed
    slots 0..S-1, those past the last query not written yet, which `visible` marks as the future like any later
    key. This class alone tells the cases apart."""

    def __init__(self, start, length, keys, device, ids=None, key_ids=None):
        self.start, self.length, self.keys, self.device = start, length, keys, device
        self.static = torch.is_tensor(start)
        if self.static:
            self.index = start + torch.arange(length, device=device)  # (T,)
            self.key_index, self.end = torch.arange(keys, device=device), keys  # every slot: a table must reach it
        else:
            if start < 0:
                raise ValueError(f"start position {start} must be >= 0")
            self.index = torch.arange(start, start + length, device=device)  # (T,)
            self.key_index = torch.arange(start + length - keys, start + length, device=device)  # (S,)
            self.end = start + length  # the positions lie below it, known on the host
        self.per_row = ids is not None
        if self.per_row:
            self.ids, self.key_ids = ids, ids if key_ids is None else key_ids  # (B, T), (B, S)
            self.end = int(self.key_ids.max()) + 1  # the tables must reach the largest position
        else:
            self.ids, self.key_ids = self.index, self.key_index

    def heads(self, t):
        """t, built per row (B, T, ...), with a head axis (B, 1, T, ...); a shared one (T, ...) as it is."""
        return t.unsqueeze(1) if self.per_row else t

    def distances(self):
        """(T, S), or (B, 1, T, S) per row: query position minus key position, >= 0 where the key is visible."""
        return self.heads(self.ids[..., :, None] - self.key_ids[..., None, :])

    def visible(self):
        """(T, S) bools: the keys at or before each query in the sequence (causality by index, not position)."""
        return self.key_index[None, :] <= self.index[:, None]

    def attention_mask(self, window=None):
        """(mask, is_causal) for scaled_dot_product_attention where no scheme bias carries the causal mask; with a
        window, each query sees only the keys less than `window` positions back (sliding-window attention).
        Branches rather than is_causal=(T > 1): under torch.compile with dynamic shapes that is a symbolic bool,
        which scaled_dot_product_attention refuses (a graph break)."""
        if window is not None and (window < self.keys or self.per_row):
            return self.visible() & (self.distances() < window), False  # (T, S) or (B, 1, T, S)
        if not self.static and self.length == 1:
            return None, False  # a lone new token may see every key
        if not self.static and self.keys == self.length:
            return None, True  # queries and keys the same tokens: the triangle from the top left
        return self.visible(), False  # (T, S): new tokens after cached ones, or a static cache's slots


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
    relative = True  # scores depend on m - n alone: shifting every position changes nothing
    extrapolates = True  # it can read positions past block_size
    reads_positions = True  # position ids change what it computes (PoSE's skipped ids act through them)
    attn_factor = 1.0  # multiplier of the softmax scale
    settings = {}  # name: (type, opt(...)), the settings this class adds; its subclasses take them too
    # transformers interop (hf.py), read from each class itself, never inherited (a subclass adds maths that its
    # parent's architecture lacks): hf_family "rotary" (GPT-NeoX; Persimmon with qk_norm) or "gpt2" runs it, else
    # hf_lacks says what those architectures lack
    hf_family, hf_lacks = None, "this scheme"

    def __init__(self, config):
        super().__init__()
        self.config = config

    @classmethod
    def check(cls, config):
        """Raise ValueError for a config this scheme cannot build."""

    @classmethod
    def transformers(cls):
        """(hf_family, hf_lacks) as this very class declares them."""
        return vars(cls).get("hf_family"), vars(cls).get("hf_lacks", Scheme.hf_lacks)

    def fitted(self, state, prefix):
        """A trained model's state dict, its entries of this scheme under prefix, fitted to this module (a
        fine-tune's source may have a longer context); by default as it is."""
        return state

    def embed(self, tok, span):
        """Token embeddings tok (B, T, C) at the span's positions -> the input (B, T, C)."""
        return tok

    def rotate(self, qk, span, layer):
        """Queries and keys stacked (2, B, nh, T, hs) at the span's positions in block `layer` -> the same shape."""
        return qk

    def bias(self, span, layer):
        """(nh, T, S) float scores added in block `layer`'s attention to the span's queries and keys, -inf where a
        key is in a query's future; None for plain causal attention."""
        return None

    def window(self, layer):
        """How many keys up to itself a query of block `layer` attends to (sliding-window attention); None: all."""
        return None

    def reserve(self, n):
        """Make any table cover positions [0, n) before compiled code (a static decoding step) reaches them."""

    def embedding_numel(self):
        """Parameters of a position table: the non-embedding parameter count leaves them out, as nanoGPT's wpe."""
        return 0

    def init_parameter(self, name, p):
        """Initialise the scheme's parameter `name` (GPT.init_weights calls it, in parameter order): by default
        GPT-2's N(0, 0.02), as for a table of embeddings."""
        nn.init.normal_(p, mean=0.0, std=0.02)


@register("rope")
class RoPE(Scheme):
    """Rotary position embedding (Su et al., RoFormer, eq. 14-15): queries and keys turned by R(m), never values;
    the maths, tables and context-extension scalings are rope.py's."""

    settings = {
        "rope_base": (float, opt(10000.0, "RoPE base b in theta_i = b^(-2(i-1)/d)")),
        "rope_fraction": (float, opt(1.0, "fraction of each head's dims that RoPE rotates")),
        "rope_layout": (
            str,
            opt("interleaved", "RoPE pairing: " + ", ".join(rope.LAYOUTS), check=one_of(rope.LAYOUTS)),
        ),
        "rope_scaling": (
            str,
            opt(
                rope.NO_SCALING,
                "RoPE context scaling: " + ", ".join(rope.SCALINGS),
                weights=False,
                check=one_of(tuple(rope.SCALINGS)),
            ),
        ),
        "rope_scaling_factor": (
            float,
            opt(
                1.0,
                "RoPE scaling factor s (1: plain RoPE)",
                weights=False,
                check=("be a finite number >= 1", lambda v: 1 <= v < math.inf),
            ),
        ),
        "rope_p": (
            float,
            opt(1.0, "p-RoPE: fraction of RoPE's frequencies that rotate, the highest (1 = all)", check=SHARE),
        ),
    }
    hf_family = "rotary"

    def __init__(self, config):
        super().__init__(config)
        self.rotary = rope.Rotary(
            config.head_dim,
            config.rope_base,
            config.rope_fraction,
            config.rope_layout,
            config.rope_scaling,
            config.rope_scaling_factor,
            original_len=config.L0,
            max_len=config.block_size,
            keep=config.rope_p,
        )

    @classmethod
    def check(cls, config):
        rope.scaling_pair(config.rope_scaling, config.rope_scaling_factor)
        rotated = int(config.head_dim * config.rope_fraction)
        if rotated % 2:
            raise ValueError(
                f"RoPE rotates pairs of dims, but head size n_embd/n_head={config.head_dim} times "
                f"rope_fraction={config.rope_fraction} gives {rotated} rotated dims; choose them so "
                "this is even"
            )

    @property
    def attn_factor(self):
        """YaRN's attention temperature, else 1."""
        return self.rotary.attn_factor

    def rotate(self, qk, span, layer):
        return self.rotary(qk, span.ids, span.end)  # one call turns queries and keys together

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

    relative = False
    hf_lacks = "a fixed sinusoidal table added to sqrt(n_embd)-scaled token embeddings"

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("sinusoid", sinusoidal_table(config.block_size, config.n_embd), persistent=False)

    @classmethod
    def check(cls, config):
        if config.n_embd % 2:
            raise ValueError(f"n_embd={config.n_embd} must be even for sinusoidal embeddings")

    def reserve(self, n):
        if n > len(self.sinusoid):
            with torch.inference_mode(False):  # a table grown while sampling must still serve training
                table = sinusoidal_table(n, self.config.n_embd).to(self.sinusoid.device)
            self.register_buffer("sinusoid", table, persistent=False)

    def embed(self, tok, span):
        table = self.sinusoid
        if span.end > len(table):  # past the built table the rows are computed from the formula on demand
            table = sinusoidal_table(span.end, tok.shape[2]).to(tok.device)
        # as in the paper, token embeddings are scaled by sqrt(d) before the +-1 table is added; unscaled
        # (std 0.02) they would be drowned by it and sinusoidal would lose any short ablation
        return tok * math.sqrt(tok.shape[2]) + table[span.ids].to(tok.dtype)


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

    settings = {
        "xpos_scale_base": (
            float | None,
            opt(None, "xpos: B in the decay zeta^((m - n)/B) of its scores (default L0 / 2, the paper's ratio)"),
        )
    }
    hf_lacks = "xPos's distance decay of queries and keys"

    def __init__(self, config):
        super().__init__(config)
        half = self.rotary.rot_dim // 2
        zeta = (2 * torch.arange(half, dtype=torch.float64) / self.rotary.rot_dim + 0.4) / 1.4  # (rot/2,)
        log_zeta = pairwise(zeta.log(), config.rope_layout, config.head_dim, fill=0.0)  # (hs,)
        self.register_buffer("log_zeta", log_zeta.float(), persistent=False)
        # B: xpos_scale_base, else L0 / 2 (the paper's ratio); once, as a scheme is rebuilt when its config changes
        self.scale = config.xpos_scale_base or config.L0 / 2

    def rotate(self, qk, span, layer):
        q, k = self.rotary(qk, span.ids, span.end)  # (B, nh, T, hs) each
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

    settings = {
        "nope_every": (
            int,
            opt(4, "rnope: every this many layers, the last has no positional information", check=POSITIVE),
        ),
        "rnope_window": (
            int | None,
            opt(
                None,
                "rnope: keys a RoPE layer's query sees, sliding-window attention (default L0 / 2, the paper's ratio)",
                check=POSITIVE,
            ),
        ),
    }
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
