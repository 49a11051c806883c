"""The GPT decoder: a pre-norm transformer in the GPT-2 mould, with the positional scheme as a switch.

    tokens -> wte (+ a position table: sinusoidal, learned) -> n_layer x Block -> ln_f -> lm_head -> logits
    Block: x + attn(ln_1(x)), then x + mlp(ln_2(x))
    attn:  q, k, v = c_attn(x); q and k turned by the scheme (RoPE: rope.py's R(m)); softmax(q k^T / sqrt(hs)) v

The scheme comes from positions.py's registry (`pos_emb`, through scheme_class); GPTConfig, at the end, declares every
setting the model reads. Decoding (KV cache, sampling) is generate.py's; this module knows nothing about training.
"""

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

import positions
import rope
from config import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, SHARE, declared, one_of, opt, validate, weightless
from spans import Span


def attention(q, k, v, mask, **kw):
    """scaled_dot_product_attention, with a scheme's float bias in the dtype it computes in. On CPU always in
    float32, even under bf16 autocast: there the bf16 flash-attention backward is much slower than float32's, while
    the matmuls around it gain (bench.py)."""
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return attention(q.float(), k.float(), v.float(), mask, **kw).to(q.dtype)
    mask = mask.to(q.dtype) if mask is not None and mask.is_floating_point() else mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head = layer, config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        # QK-norm puts each head's queries and keys at mean 0 and RMS 1, times a learned gain per dim (shared by the
        # heads), so under the 1/sqrt(hs) scale kept below a score is at most sqrt(hs) times the gains. Gain-less,
        # that cap (5.7 at hs = 32) would keep attention flat; the gains, starting at 1, let each layer learn its
        # sharpness. A LayerNorm rather than an RMSNorm: Persimmon's qk_layernorm, so transformers runs it as it is
        if config.qk_norm:
            self.ln_q, self.ln_k = (nn.LayerNorm(config.head_dim, bias=config.bias) for _ in "qk")
        self.qk_norm = config.qk_norm

    def forward(self, x, scheme, span, cache):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        qk = qkv[:2]
        if self.qk_norm:  # before the scheme's rotation or scaling; in float32 as the gains, under autocast too
            qk = torch.stack((self.ln_q(qk[0].float()), self.ln_k(qk[1].float()))).to(qk.dtype)  # (2, B, nh, T, hs)
        q, k = scheme.rotate(qk, span, self.layer)  # RoPE turns queries and keys here; values never carry position
        v = qkv[2]
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nh, S, hs): the span's keys
        scale = scheme.attn_factor / math.sqrt(q.shape[-1])
        dropout = self.dropout if self.training else 0.0
        mask, causal = scheme.bias(span, self.layer), False  # (nh, T, S) with the causal mask built in, or None
        if mask is None:
            mask, causal = span.attention_mask(scheme.window(self.layer))
        y = attention(q, k, v, mask, dropout_p=dropout, is_causal=causal, scale=scale)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


ACTIVATIONS = {  # mlp_act -> the MLP's nonlinearity
    "gelu": F.gelu,  # the exact (erf) GELU of GPT-2's paper
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # the approximation GPT-2's checkpoints were trained with
    "relu2": lambda x: F.relu(x).square(),  # ReLU squared (So et al. 2021, "Primer")
}


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.act = ACTIVATIONS[config.mlp_act]
        self.dropout = config.dropout

    def forward(self, x):
        return F.dropout(self.c_proj(self.act(self.c_fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.parallel_residual = config.parallel_residual

    def forward(self, x, scheme, span, cache):
        if self.parallel_residual:
            return x + self.attn(self.ln_1(x), scheme, span, cache) + self.mlp(self.ln_2(x))
        x = x + self.attn(self.ln_1(x), scheme, span, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))  # the architecture, then its scheme
        # registered in GPT-2's order, the order in which init_weights draws their starting values
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.scheme = scheme_class(config.pos_emb)(config)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = blocks
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:  # the head reuses the token embedding (fewer parameters, better small models)
            self.lm_head.weight = self.wte.weight
        self.init_weights()

    def init_weights(self):
        """GPT-2 initialisation, the one place every weight gets its start."""
        for name, p in self.named_parameters():
            if name.startswith("scheme."):  # the positional scheme says how its own parameters start
                self.scheme.init_parameter(name.removeprefix("scheme."), p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight") and self.config.zero_init_proj:
                nn.init.zeros_(p)  # each block starts as the identity; c_proj's own gradient is not zero
            elif name.endswith("c_proj.weight"):
                # each block adds two residual branches: scale them so the residual stream's variance stays O(1)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
            else:  # embeddings, an untied head (GPT-2's scale, as the tied one starts) and the other linear weights
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, cache=None, start_pos=0, reduction="mean", position_ids=None):
        """Logits (B, T, vocab) and the cross-entropy if targets are given: their mean, or with reduction="none" each
        position's (B, T). idx holds tokens at positions start_pos onwards, or at each row's own increasing
        position_ids (B, T) (PoSE's skipped ids); with a cache, only the new tokens, after the cached ones. Without
        targets only the last position's logits are computed (all that generation needs)."""
        T = idx.shape[1]
        span = cache.span(T, position_ids) if cache is not None else Span(start_pos, T, T, idx.device, position_ids)
        x = self.drop(self.scheme.embed(self.wte(idx), span))  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.scheme, span, cache)
        x = self.ln_f(x)
        if targets is None:
            return self.head(x[:, -1:, :]), None  # (B, 1, vocab)
        logits = self.head(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1, reduction=reduction)
        if reduction == "none":
            loss = loss.view(targets.shape)  # (B, T)
        return logits, loss

    def head(self, x):
        """Logits of the final states; with logit_softcap = c, c * tanh(logits / c), in float32: near the cap bf16's
        8 bits would make distinct logits equal."""
        logits = self.lm_head(x)
        c = self.config.logit_softcap
        return c * torch.tanh(logits.float() / c) if c else logits

    def num_params(self, non_embedding=True):
        """Parameter count; non_embedding leaves out the lookup tables, which cost no multiplications: a position
        table, and the token embedding when the head has a weight of its own (tied, it is the head: counted once)."""
        n = sum(p.numel() for p in self.parameters())
        tables = self.scheme.embedding_numel() + (0 if self.config.tie_embeddings else self.wte.weight.numel())
        return n - tables if non_embedding else n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward): 6N for the weights plus attention's 12·L·T·d (PaLM app. B)."""
        return 6 * self.num_params() + 12 * self.config.n_layer * seq_len * self.config.n_embd

    def load_trained(self, state):
        """Load a trained state dict, a fine-tune's source's too, its scheme's part fitted to this model (a learned
        table cut to a shorter block_size)."""
        self.load_state_dict(self.scheme.fitted(state, "scheme."))
        return self

    def reconfigure(self, **changes):
        """Change settings that no weight depends on (the RoPE scaling past block_size, L0), or the scheme itself
        between schemes with the same parameters (DroPE's drop of RoPE; the settings the new scheme does not take
        return to their defaults). The scheme is rebuilt from the new config, keeping its trained parameters."""
        allowed = [k for k in weightless(GPTConfig) if k not in declared("built", GPTConfig)] + ["pos_emb"]
        fixed = [k for k in changes if k not in allowed]
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot change on a built model; only {', '.join(allowed)} can")
        config = self.config.with_scheme(changes.pop("pos_emb")) if "pos_emb" in changes else self.config
        config = replace(config, **changes)
        scheme = scheme_class(config.pos_emb)(config).to(self.wte.weight.device)
        try:
            scheme.load_state_dict(self.scheme.state_dict())  # a scheme's trained parameters are kept
        except RuntimeError:  # missing or unexpected keys: the two schemes have different parameters
            raise ValueError(
                f"pos_emb={self.config.pos_emb!r} cannot become {config.pos_emb!r} on a built model: "
                "their parameters differ"
            ) from None
        self.scheme, self.config = scheme, config
        return self


def scheme_class(name):
    """The positional scheme registered as pos_emb=name, or a ValueError listing them. schemes.py is imported here
    where a run names one of its schemes: its classes join positions.SCHEMES as they are defined."""
    if name in positions.ELSEWHERE:
        import schemes  # noqa: F401 (imported for its registrations)
    if name not in positions.SCHEMES:
        raise ValueError(f"pos_emb={name!r} is unknown; choose one of {', '.join(positions.NAMES)}")
    return positions.SCHEMES[name]


def all_schemes():
    """{name: class} of every registered scheme, those of the tables first in their order: what generic tests and
    the ablation loop over."""
    import schemes  # noqa: F401 (imported for its registrations)

    return {name: positions.SCHEMES[name] for name in positions.NAMES} | positions.SCHEMES


@dataclass
class GPTConfig:
    """Every setting the model reads, with the rules between them. A scheme's own settings name the scheme they act
    on (`applies`: it and its subclasses); elsewhere a value other than the default is refused."""

    block_size: int = opt(256, "context length the model is trained at", weights=False, built=True, check=POSITIVE)
    vocab_size: int = opt(65, "vocabulary size; set from the dataset's meta.json", check=POSITIVE)
    n_layer: int = opt(6, "number of transformer blocks", check=POSITIVE)
    n_head: int = opt(6, "attention heads per block", check=POSITIVE)
    n_embd: int = opt(384, "model width", check=POSITIVE)
    dropout: float = opt(0.0, "dropout probability", weights=False, built=True, resume=True, check=FRACTION)
    bias: bool = opt(False, "biases in linear layers and layer norms")
    pos_emb: str = opt("rope", "positional scheme: " + ", ".join(positions.NAMES))
    original_len: int | None = opt(
        None,
        "L0, the context the model first learned (default block_size): every length-relative default reads it, and "
        "a fine-tune at a longer block_size keeps its checkpoint's",
        weights=False,
        check=POSITIVE,
        renamed=("rope_original_len",),
    )
    qk_norm: bool = opt(False, "layer-normalise each head's queries and keys (learned gain) before positions, scores")
    mlp_act: str = opt("gelu", "MLP activation: " + ", ".join(ACTIVATIONS), check=one_of(tuple(ACTIVATIONS)))
    tie_embeddings: bool = opt(True, "the head reuses the token embedding (false: a head of its own)")
    logit_softcap: float = opt(0.0, "c > 0: logits squashed to c * tanh(logits / c) (0: off)", check=NON_NEGATIVE)
    zero_init_proj: bool = opt(False, "the attention and MLP output projections start at zero")
    parallel_residual: bool = opt(False, "x + attn(ln_1(x)) + mlp(ln_2(x)), as GPT-NeoX (false: in turn, as GPT-2)")
    # RoPE's (rope.py), and so its subclasses' (xpos, rnope)
    rope_base: float = opt(10000.0, "RoPE base b in theta_i = b^(-2(i-1)/d)", applies="rope")
    rope_fraction: float = opt(1.0, "fraction of each head's dims that RoPE rotates", applies="rope")
    rope_layout: str = opt(
        "interleaved", "RoPE pairing: " + ", ".join(rope.LAYOUTS), applies="rope", check=one_of(rope.LAYOUTS)
    )
    rope_scaling: str = opt(
        rope.NO_SCALING, "RoPE context scaling: none or a name in scalings.py's SCALINGS", applies="rope", weights=False
    )
    rope_scaling_factor: float = opt(
        1.0, "RoPE scaling factor s (1: none)", applies="rope", weights=False, check=AT_LEAST_1
    )
    rope_p: float = opt(1.0, "p-RoPE: share of RoPE's frequencies that turn, the highest", applies="rope", check=SHARE)
    # the other schemes' (schemes.py)
    xpos_scale_base: float | None = opt(
        None, "xpos: B in the decay zeta^((m - n)/B) of its scores (default L0 / 2, the paper's ratio)", applies="xpos"
    )
    nope_every: int = opt(
        4, "rnope: every this many layers, the last has no positional information", applies="rnope", check=POSITIVE
    )
    rnope_window: int | None = opt(
        None,
        "rnope: keys a RoPE layer's query sees (default L0 / 2, the paper's ratio)",
        applies="rnope",
        check=POSITIVE,
    )

    def __post_init__(self):
        scheme = scheme_class(self.pos_emb)  # an unknown name fails first
        validate(self)
        if self.L0 > self.block_size:
            raise ValueError(
                f"original_len={self.original_len} (L0) exceeds block_size={self.block_size}; L0 is the length "
                "first trained, at most the context now"
            )
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for f in fields(self):
            if getattr(self, f.name) != f.default and not self.takes(f.name):
                users = ", ".join(name for name in all_schemes() if self.takes(f.name, name))
                raise ValueError(
                    f"{f.name}={getattr(self, f.name)!r} does nothing for pos_emb={self.pos_emb!r}; it applies to "
                    f"pos_emb {users}"
                )
        scheme.check(self)

    def takes(self, name, pos_emb=None):
        """Whether setting name acts on pos_emb (default this config's scheme), as its field declares."""
        applies = self.__dataclass_fields__[name].metadata["applies"]
        return applies is None or issubclass(scheme_class(pos_emb or self.pos_emb), scheme_class(applies))

    @property
    def L0(self):
        """The length the model first learned: original_len as typed, else block_size."""
        return self.original_len or self.block_size

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def rotated_dims(self):
        """The dims of a head that RoPE turns (rope_fraction of them; the rest pass through)."""
        return int(self.head_dim * self.rope_fraction)

    def with_scheme(self, name):
        """This config with pos_emb=name, the settings that do not apply to that scheme back at their defaults."""
        return replace(self, pos_emb=name, **{f.name: f.default for f in fields(self) if not self.takes(f.name, name)})

    def asdict(self):
        """Every setting as given (None where a default rule applies)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def resolved(self):
        """asdict with the default rules applied: what the settings mean."""
        return self.asdict() | {"original_len": self.L0}
