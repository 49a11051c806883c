"""Positional schemes: the `pos_emb` switch. RoPE and sinusoidal embeddings here; the ablation's others in schemes.py.

A scheme may put position in three places of the decoder, and each class says which:

* `embed(tok, span)`: the input, token embeddings at the span's positions (sinusoidal, learned);
* `rotate(qk, span, layer)`: queries and keys stacked (2, B, nh, T, hs) (rope, xpos);
* `bias(span, layer)`: scores added in attention, (nh, T, S) with the causal mask built in (alibi, kerple, fire).

A span (spans.py) says at which positions a forward's T queries and S keys sit. Adding a scheme is one class with
@register, its settings as fields of model.GPTConfig (each naming the scheme it applies to) and its tests. The schemes
of schemes.py are listed in `ELSEWHERE`; model.scheme_class imports that module only when a run names one of them,
so a plain RoPE run reads none of them, and this module imports nothing of its own but rope.py (and scalings.py,
where a run names a scaling or p-RoPE).
"""

import math

import torch
import torch.nn as nn

import rope

SCHEMES = {}  # pos_emb name -> scheme class, as each module that defines one is imported
ELSEWHERE = ("learned", "alibi", "none", "xpos", "kerple", "fire", "rnope")  # schemes.py's, imported by model.py
NAMES = ("rope", "sinusoidal", *ELSEWHERE)  # every pos_emb, in the order of the tables


def register(name):
    def add(cls):
        assert name not in SCHEMES, f"positional scheme {name!r} is registered twice"
        cls.name = name
        SCHEMES[name] = cls
        return cls

    return add


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


def rope_frequencies(config):
    """(theta' float64 (rot/2,), attention factor, at_length) that a RoPE model of config turns its pairs by: rope.py's
    theta_i, or, where a scaling or p-RoPE is set, scalings.py's transform of them. at_length is None, or, for a
    theta' that grows with the total length past L0 (dynamic NTK), the function of that length that gives it."""
    if config.rope_scaling == rope.NO_SCALING and config.rope_p == 1:
        return rope.frequencies(config.rotated_dims, config.rope_base), 1.0, None
    import scalings  # only where a run names a scaling or p-RoPE: a plain RoPE run never reads scalings.py

    return scalings.of_model(config)


@register("rope")
class RoPE(Scheme):
    """Rotary position embedding (Su et al., RoFormer, eq. 14-15): queries and keys turned by R(m), never values.

    theta' is resolved once, from the config, when the scheme is built; the float32 cos/sin tables of positions
    [0, block_size) are non-persistent buffers: derived from the config, they follow the model across devices but
    stay out of checkpoints."""

    hf_family = "rotary"

    def __init__(self, config):
        super().__init__(config)
        self.layout = config.rope_layout
        # theta' on the CPU (MPS has no float64), resolved once: the tables and the rotation never ask which scaling
        # made it (dynamic NTK's at_length gives theta' at each length past L0)
        self.inv_freq, self.attn_factor, self.at_length = rope_frequencies(config)
        self.rot_dim = 2 * len(self.inv_freq)
        self.build_tables(config.block_size, device=None)

    @classmethod
    def check(cls, config):
        if config.rope_scaling != rope.NO_SCALING or config.rope_scaling_factor != 1:
            import scalings  # a scaling is named: its rules are scalings.py's

            scalings.scaling_pair(config.rope_scaling, config.rope_scaling_factor)
        rotated = config.rotated_dims
        if rotated % 2 or not 2 <= rotated <= config.head_dim:
            raise ValueError(
                f"RoPE rotates pairs of dims, but head size n_embd/n_head={config.head_dim} times "
                f"rope_fraction={config.rope_fraction} gives {rotated} rotated dims; choose them so this is even "
                "and in [2, head size]"
            )

    def rotate(self, qk, span, layer):
        """Queries and keys stacked (2, B, nh, T, hs), turned together at the span's positions."""
        cos, sin = self.tables(span)  # (T, rot/2), or (B, 1, T, rot/2) for each row's own positions
        return rope.apply_rope(qk, cos, sin, self.layout)

    def tables(self, span):
        """cos, sin of the span's positions: rows of the built tables, or past L0 under dynamic NTK the rows
        computed at the span's total length (keys already in a KV cache keep the frequencies they were turned by)."""
        if self.at_length and span.end > self.config.L0:
            cos, sin = rope.tables(self.at_length(span.end), span.ids)  # (T, rot/2)
        else:
            self.reserve(span.end)
            cos, sin = self.cos[span.ids], self.sin[span.ids]  # (T, rot/2) or (B, T, rot/2)
        if span.ids.dim() == 2:  # each row's own positions: broadcast over the heads
            return cos[:, None], sin[:, None]  # (B, 1, T, rot/2)
        return cos, sin

    def build_tables(self, n, device):
        """The float32 cos/sin tables of positions [0, n) on device (rope.tables: float64 angles, rounded once)."""
        with torch.inference_mode(False):  # a table grown during generation must still serve training afterwards
            cos, sin = rope.tables(self.inv_freq, torch.arange(n), device)  # (n, rot/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) would round the tables (bf16 cannot tell position 256 from 257): rebuild them in
        # float32 wherever the buffers went instead of casting rounded values back
        super()._apply(fn, recurse)
        self.build_tables(self.cos.shape[0], self.cos.device)
        return self

    def reserve(self, n):
        """Make the tables cover positions [0, n); call it before compiled code reaches position n - 1."""
        if n <= self.cos.shape[0]:
            return
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"position {n - 1} is past the rotary table ({self.cos.shape[0]} positions) inside a compiled "
                f"region, where it cannot be rebuilt: call reserve({n}) first or build the model with block_size >= {n}"
            )
        self.build_tables(max(n, 2 * self.cos.shape[0]), self.cos.device)  # doubling: few rebuilds as a cache grows


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
