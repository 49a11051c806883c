"""Positional schemes: the `pos_emb` switch. RoPE and sinusoidal embeddings here; the ablation's others in schemes.py.

A scheme may put position in three places of the decoder, and each class says which:

* `embed(tok, span)`: the input, token embeddings at the span's positions (sinusoidal, learned);
* `rotate(qk, span, layer)`: queries and keys stacked (2, B, nh, T, hs) (rope, xpos);
* `bias(span, layer)`: scores added in attention, (nh, T, S) with the causal mask built in (alibi, kerple, fire).

A span (spans.py) says at which positions a forward's T queries and S keys sit. Adding a scheme is one class with
@register, its settings as fields of model.GPTConfig (each naming the scheme it applies to) and its tests. A scheme
outside this file is listed in `ELSEWHERE`, and its module is imported only when a run names it, so a plain RoPE run
reads none of them.
"""

import importlib
import math

import torch
import torch.nn as nn

import rope

SCHEMES = {}  # pos_emb name -> scheme class, as each module that defines one is imported
ELSEWHERE = dict.fromkeys(("learned", "alibi", "none", "xpos", "kerple", "fire", "rnope"), "schemes")  # name -> module
NAMES = ("rope", "sinusoidal", *ELSEWHERE)  # every pos_emb, in the order of the tables


def register(name):
    def add(cls):
        assert name not in SCHEMES, f"positional scheme {name!r} is registered twice"
        cls.name = name
        SCHEMES[name] = cls
        return cls

    return add


def scheme(name):
    """The scheme class registered as name (its module imported where it is not yet), or a ValueError listing them."""
    if name not in SCHEMES and name in ELSEWHERE:
        importlib.import_module(ELSEWHERE[name])
    if name not in SCHEMES:
        raise ValueError(f"pos_emb={name!r} is unknown; choose one of {', '.join(NAMES)}")
    return SCHEMES[name]


def all_schemes():
    """{name: class} of every scheme, in the order of the tables: what generic tests and the ablation loop over."""
    for module in dict.fromkeys(ELSEWHERE.values()):
        importlib.import_module(module)
    return dict(SCHEMES)


class Scheme(nn.Module):
    """The contract every scheme implements; this base adds nothing, and each scheme overrides what it adds."""

    name = None  # set by register
    relative = True  # scores depend on m - n alone: shifting every position changes nothing
    extrapolates = True  # it can read positions past block_size
    reads_positions = True  # position ids change what it computes (PoSE's skipped ids act through them)
    attn_factor = 1.0  # multiplier of the softmax scale
    # transformers interop (hf.py), read from each class itself, never inherited (a subclass adds maths its parent's
    # architecture lacks): hf_family "rotary" (GPT-NeoX; Persimmon with qk_norm) or "gpt2" runs it, else hf_lacks
    # says what those architectures lack
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

    def embed(self, tok, span):
        """Token embeddings tok (B, T, C) at the span's positions -> the input (B, T, C)."""
        return tok

    def rotate(self, qk, span, layer):
        """Queries and keys stacked (2, B, nh, T, hs) at the span's positions in block `layer` -> the same shape."""
        return qk

    def bias(self, span, layer):
        """(nh, T, S) scores added in block `layer`, -inf where a key is in a query's future; None: plainly causal."""
        return None

    def window(self, layer):
        """How many keys up to itself a query of block `layer` attends to (sliding-window attention); None: all."""
        return None

    def reserve(self, n):
        """Make any table cover positions [0, n) before compiled code (a static decoding step) reaches them."""

    def fitted(self, state, prefix):
        """A trained state dict, this scheme's entries under prefix, fitted to this module (by default as it is)."""
        return state

    def embedding_numel(self):
        """Parameters of a position table: the non-embedding parameter count leaves them out, as nanoGPT's wpe."""
        return 0

    def init_parameter(self, name, p):
        """Initialise the scheme's parameter `name` (GPT.init_weights asks): by default GPT-2's N(0, 0.02)."""
        nn.init.normal_(p, mean=0.0, std=0.02)


class Rotary(nn.Module):
    """RoPE's frequencies and float32 cos/sin tables for positions [0, max_len), and the rotation of q or k. The tables
    are non-persistent buffers: derived from the config, they follow the module across devices but stay out of
    checkpoints. A scaling (scalings.py) or p-RoPE's share p of kept frequencies changes theta; at factor 1 and p = 1
    it is rope.py's theta_i."""

    def __init__(
        self,
        head_dim,
        base=10000.0,
        fraction=1.0,
        layout="interleaved",
        scaling=rope.NO_SCALING,
        factor=1.0,
        original_len=256,
        max_len=256,
        p=1.0,
    ):
        super().__init__()
        rot_dim = int(head_dim * fraction)
        if not (0 < rot_dim <= head_dim and rot_dim % 2 == 0):
            raise ValueError(
                f"head_dim={head_dim} * fraction={fraction} gives rot_dim={rot_dim}; it must be even "
                f"and in [2, {head_dim}]"
            )
        if layout not in rope.LAYOUTS:
            raise ValueError(f"layout={layout!r} is not one of {rope.LAYOUTS}")
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be >= 1")
        self.head_dim, self.rot_dim, self.base, self.layout = head_dim, rot_dim, base, layout
        self.scaling, self.factor, self.original_len, self.p = scaling, factor, original_len, p
        self.plain = scaling == rope.NO_SCALING and p == 1  # rope.py's theta_i alone: scalings.py is not read
        self._build(max_len, device=None)  # first: it refuses an unknown scaling with a ValueError naming them
        # past L0 a dynamic scaling has no fixed table (generate.py's static cache reads the same rule)
        self.dynamic = not self.plain and self.scalings().in_force_scaling(scaling, factor).dynamic

    def frequencies(self, seq_len=None):
        """(theta float64, attention factor): rope.py's, or the scaling's at total length seq_len (dynamic)."""
        if self.plain:
            return rope.frequencies(self.rot_dim, self.base), 1.0
        return self.scalings().frequencies(
            self.rot_dim, self.base, self.scaling, self.factor, self.original_len, seq_len, self.p
        )

    @staticmethod
    def scalings():
        """scalings.py, imported where a run names a scaling or p-RoPE: a plain RoPE run reads rope.py alone."""
        return importlib.import_module("scalings")

    def _build(self, n, device):
        """(Re)build theta (kept on the CPU as a plain attribute: MPS has no float64) and the tables for [0, n)."""
        self.inv_freq, self.attn_factor = self.frequencies()
        with torch.inference_mode(False):  # a table grown during generation must still serve training afterwards
            cos, sin = rope.tables(self.inv_freq, torch.arange(n), device)  # (n, rot/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) would round the tables (bf16 cannot tell position 256 from 257): rebuild them in
        # float32 wherever the buffers went instead of casting rounded values back
        super()._apply(fn, recurse)
        self._build(self.cos.shape[0], self.cos.device)
        return self

    def forward(self, x, positions=None, end=None):
        """Rotate x (..., T, hs), e.g. q and k stacked (2, B, nh, T, hs), as the integer positions (T,) (default
        0..T-1) or each row's (B, T), all below end: an int known on the host that the tables must reach."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x has hs={x.shape[-1]} but this Rotary was built for head_dim={self.head_dim}")
        if positions is None:
            positions, end = torch.arange(x.shape[-2], device=x.device), x.shape[-2]
        if self.dynamic and end > self.original_len:
            # theta depends on the total length, so no fixed table serves: compute the T rows needed (keys already
            # in a KV cache keep the frequencies they were rotated with)
            cos, sin = rope.tables(self.frequencies(seq_len=end)[0], positions)  # (T, rot/2)
        else:
            self.reserve(end)
            cos, sin = self.cos[positions], self.sin[positions]  # (T, rot/2) or (B, T, rot/2)
        if positions.dim() == 2:  # each row's own positions: broadcast over the heads
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, rot/2)
        return rope.apply_rope(x, cos, sin, self.layout)

    def reserve(self, n):
        """Make the tables cover positions [0, n); call it before compiled code reaches position n - 1."""
        if n <= self.cos.shape[0]:
            return
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"position {n - 1} is past the rotary table ({self.cos.shape[0]} positions) inside a compiled "
                f"region, where it cannot be rebuilt: call reserve({n}) first or build Rotary with max_len >= {n}"
            )
        self._build(max(n, 2 * self.cos.shape[0]), self.cos.device)  # doubling: few rebuilds as a KV cache grows


@register("rope")
class RoPE(Scheme):
    """Rotary position embedding (Su et al., RoFormer, eq. 14-15): queries and keys turned by R(m), never values."""

    hf_family = "rotary"

    def __init__(self, config):
        super().__init__(config)
        self.rotary = Rotary(
            config.head_dim,
            config.rope_base,
            config.rope_fraction,
            config.rope_layout,
            config.rope_scaling,
            config.rope_scaling_factor,
            original_len=config.L0,
            max_len=config.block_size,
            p=config.rope_p,
        )

    @classmethod
    def check(cls, config):
        if config.rope_scaling != rope.NO_SCALING or config.rope_scaling_factor != 1:
            Rotary.scalings().scaling_pair(config.rope_scaling, config.rope_scaling_factor)
        rotated = int(config.head_dim * config.rope_fraction)
        if rotated % 2:
            raise ValueError(
                f"RoPE rotates pairs of dims, but head size n_embd/n_head={config.head_dim} times "
                f"rope_fraction={config.rope_fraction} gives {rotated} rotated dims; choose them so this is even"
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
    """(n_pos, d) float32 absolute encodings of "Attention Is All You Need" (section 3.5):
    PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)): RoPE's angles, added."""
    if not (isinstance(d, int) and d > 0 and d % 2 == 0):
        raise ValueError(f"d={d!r} must be a positive even int: sin and cos fill pairs of dims")
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * rope.frequencies(d, base)[None, :]  # (n_pos, d/2)
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
