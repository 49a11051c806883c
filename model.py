"""The GPT decoder, its KV cache, and generation.

A pre-norm transformer decoder in the GPT-2 mould. The positional scheme is a
config switch (`pos_emb`); all of its maths lives in rope.py. This module knows
nothing about training.
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

import rope
from config import opt

POS_EMBS = ("rope", "sinusoidal", "learned", "alibi", "none")


@dataclass
class GPTConfig:
    block_size: int = opt(256, "context length the model is trained at (L0)")
    vocab_size: int = opt(65, "vocabulary size; set from the dataset's meta.json")
    n_layer: int = opt(6, "number of transformer blocks")
    n_head: int = opt(6, "attention heads per block")
    n_embd: int = opt(384, "model width")
    dropout: float = opt(0.0, "dropout probability (0 for pretraining small models)")
    bias: bool = opt(False, "biases in linear layers and layer norms")
    pos_emb: str = opt("rope", "positional scheme: " + ", ".join(POS_EMBS))
    rope_base: float = opt(10000.0, "RoPE base b in theta_i = b^(-2(i-1)/d)")
    rope_fraction: float = opt(1.0, "fraction of each head's dims that RoPE rotates")
    rope_layout: str = opt("interleaved", "RoPE pairing: " + ", ".join(rope.LAYOUTS))
    rope_scaling: str = opt("none", "RoPE context scaling: " + ", ".join(rope.SCALINGS))
    rope_scaling_factor: float = opt(1.0, "RoPE scaling factor s (1 = plain RoPE)")

    def __post_init__(self):
        if self.pos_emb not in POS_EMBS:
            raise ValueError(f"pos_emb={self.pos_emb!r} is unknown; choose one of {', '.join(POS_EMBS)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must lie in [0, 1)")
        if self.pos_emb == "rope" and int(self.head_dim * self.rope_fraction) % 2:
            raise ValueError(f"RoPE rotates pairs of dims, but head size n_embd/n_head={self.head_dim} times "
                             f"rope_fraction={self.rope_fraction} gives {int(self.head_dim * self.rope_fraction)} "
                             "rotated dims; choose them so this is even")
        if self.pos_emb == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"n_embd={self.n_embd} must be even for sinusoidal embeddings")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    def asdict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


class KVCache:
    """Keys and values of every layer for positions [0, length), preallocated for max_len.

    One tensor per layer: a compiled decoding step then writes each in place, where with one all-layer
    tensor inductor copied the whole cache every token (at max_len 512 on the CPU model: 0.79 against
    0.41 ms a token). One slot more than max_len is allocated and never used: the keys read are then
    never the whole tensor, a case torch.compile would otherwise compile a graph of its own for."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.n_head, max_len + 1, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.max_len = max_len
        self.length = 0  # positions filled and committed by earlier forwards

    def update(self, layer, k, v):
        """Store this forward's k, v (B, nh, T, hs) after the cached ones; return all of them."""
        start, end = self.length, self.length + k.shape[2]
        assert end <= self.max_len, f"KV cache overflow: {end} > {self.max_len}"
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def attention(q, k, v, mask, **kw):
    """scaled_dot_product_attention; on CPU always in float32, even under bf16 autocast: there the bf16
    flash-attention backward is ~4x slower than float32's, while the matmuls around it gain 2.5x (bench.py)."""
    if q.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        mask = mask.to(q.dtype) if mask is not None and mask.is_floating_point() else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, **kw).to(q.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer, self.n_head = layer, config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x, pos, cache, offset):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, k, v = qkv
        if pos.rotary is not None:  # RoPE turns queries and keys, never values; one call rotates both
            q, k = pos.rotary(qkv[:2], offset)  # (2, B, nh, T, hs)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nh, past+T, hs)
        past = k.shape[2] - T  # keys before this forward's first query
        scale = pos.attn_factor / math.sqrt(q.shape[-1])
        dropout = self.dropout if self.training else 0.0
        # branches rather than is_causal=(T > 1): with dynamic shapes under torch.compile that is a symbolic
        # bool, which scaled_dot_product_attention refuses (a graph break per layer)
        causal = False
        if pos.alibi_slopes is not None:
            mask = rope.alibi_bias(pos.alibi_slopes, T, k.shape[2], past)  # (nh, T, past+T)
        elif T == 1:  # a lone new token may see every key
            mask = None
        elif past == 0:  # plain causal
            mask, causal = None, True
        else:  # new tokens after cached ones: is_causal would align the triangle top-left
            mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
        y = attention(q, k, v, mask, dropout_p=dropout, is_causal=causal, scale=scale)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x):
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, pos, cache, offset):
        x = x + self.attn(self.ln_1(x), pos, cache, offset)
        return x + self.mlp(self.ln_2(x))


class Positions(nn.Module):
    """What each scheme adds to the model: an input embedding, a query/key rotation, or an attention bias."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rotary = self.wpe = None
        alibi = config.pos_emb == "alibi"
        self.register_buffer("alibi_slopes", rope.alibi_slopes(config.n_head) if alibi else None, persistent=False)
        if config.pos_emb == "rope":
            self.rotary = rope.Rotary(config.head_dim, config.rope_base, config.rope_fraction, config.rope_layout,
                                      config.rope_scaling, config.rope_scaling_factor,
                                      original_len=config.block_size, max_len=config.block_size)
        elif config.pos_emb == "learned":
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        elif config.pos_emb == "sinusoidal":
            self.register_buffer("sinusoid", rope.sinusoidal_table(config.block_size, config.n_embd), persistent=False)

    @property
    def attn_factor(self):
        """Multiplier of the softmax scale: YaRN's temperature, else 1."""
        return self.rotary.attn_factor if self.rotary is not None else 1.0

    def set_rope_scaling(self, scaling, factor=1.0, original_len=None):
        assert self.rotary is not None, "RoPE scaling needs pos_emb='rope'"
        self.rotary.set_scaling(scaling, factor, original_len)

    def embed(self, tok, offset):
        """The input embedding of token embeddings tok (B, T, C) at positions offset..offset+T-1."""
        end = offset + tok.shape[1]
        if self.wpe is not None:
            if end > self.config.block_size:
                raise ValueError(f"position {end - 1} is past the learned table (block_size={self.config.block_size}); "
                                 "learned positions cannot extrapolate")
            return tok + self.wpe(torch.arange(offset, end, device=tok.device))
        if self.config.pos_emb == "sinusoidal":
            # the formula extends to any position; past the built table it is computed on demand
            table = self.sinusoid if end <= len(self.sinusoid) else rope.sinusoidal_table(end, tok.shape[2]).to(tok.device)
            # as in the paper, token embeddings are scaled by sqrt(d) before the +-1 table is added; unscaled
            # (std 0.02) they would be drowned by it and sinusoidal would lose any short ablation
            return tok * math.sqrt(tok.shape[2]) + table[offset:end].to(tok.dtype)
        return tok


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = Positions(config)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the output projection reuses the token embedding (fewer parameters, better small models)
        self.lm_head.weight = self.wte.weight
        self.init_weights()

    def init_weights(self):
        """GPT-2 initialisation, the one place every weight gets its start."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):
                # each block adds two residual branches: scale them so the residual stream's variance stays O(1)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
            else:  # embeddings (tied with the head) and the other linear weights
                nn.init.normal_(p, mean=0.0, std=0.02)

    def num_params(self, non_embedding=True):
        """Parameter count; the tied token embedding counts once (it is also the head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos.wpe is not None:
            n -= self.pos.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward): 6N for the weights plus attention's 12·L·T·d (PaLM appendix B)."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * seq_len * c.n_embd

    def forward(self, idx, targets=None, cache=None, start_pos=0, reduction="mean"):
        """Logits (B, T, vocab) and the cross-entropy if targets are given: their mean, or with
        reduction="none" each position's (B, T).

        idx holds tokens at positions start_pos onwards; with a cache, only the new tokens, which
        sit after the cached ones. Without targets only the last position's logits are computed
        (all that generation needs).
        """
        T = idx.shape[1]
        offset = cache.length if cache is not None else start_pos
        x = self.drop(self.pos.embed(self.wte(idx), offset))  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.pos, cache, offset)
        if cache is not None:
            cache.length += T
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # (B, 1, vocab)
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1, reduction=reduction)
        if reduction == "none":
            loss = loss.view(targets.shape)  # (B, T)
        return logits, loss

    def max_context(self, requested=None):
        """How many tokens generation may attend to: block_size for absolute schemes, else what was asked."""
        if requested is None or requested == self.config.block_size:
            return self.config.block_size
        if self.config.pos_emb == "learned":
            raise ValueError(f"max_context={requested} needs a scheme that extrapolates; learned positions stop at "
                             f"block_size={self.config.block_size} (use rope, alibi, sinusoidal or none)")
        if requested < 1:
            raise ValueError(f"max_context={requested} must be a positive integer")
        return requested

    @torch.inference_mode()  # lighter than no_grad: no version counters or views tracked (~20% per token on CPU)
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
                 use_cache=True, compile=False, generator=None):
        """Sample max_new_tokens after the prompt idx (B, T); yields each new token (B, 1) as it is drawn.

        When the text outgrows the context N, the window slides: the newest N//2 tokens are kept and
        re-read from position 0. The cache and the recompute-everything path (use_cache=False) share this
        rule, so greedy decoding gives identical tokens either way.

        compile=True runs the cached steps after the prompt (a forward and the pick of the next token)
        through torch.compile: a small model's step is mostly per-operation overhead, which fused graphs
        remove (bench.py measures both). Three graphs serve every position: the first step, the later
        steps (torch.compile sees the cache length change and makes it a symbol) and the window's
        re-read after a slide. The prompt is read once, eagerly. Compiled sampling draws the same
        tokens for a seed as eager unless two candidates tie within float rounding.
        """
        if compile and not use_cache:
            raise ValueError("compile=True compiles the cached decoding; it needs use_cache=True")
        n_ctx = self.max_context(max_context)
        keep = max(1, n_ctx // 2)
        device = idx.device.type
        # under autocast keys and values come out in the autocast dtype: the cache must hold that
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.wte.weight.dtype
        if self.pos.rotary is not None:
            self.pos.rotary.reserve(n_ctx)  # the compiled step cannot grow the tables

        def step(tokens, cache, noise):
            """Read tokens (after the cached ones) and pick the next one; compiled, the pick runs in the graph."""
            logits, _ = self(tokens, cache=cache)
            return pick(logits[:, -1, :], noise, temperature, top_k, top_p)

        # on CPU a C++ launcher (cpp_wrapper) saves ~80 us a token over inductor's Python one (CPU model).
        # Not dynamic=True: with every size a symbol the step is ~10% slower than with only the length
        compiled = torch.compile(step, options={"cpp_wrapper": device == "cpu"}) if compile else step
        # the model conditions on window + drawn. With the cache, tokens drawn since the window was read
        # join it only when it is read again, at a slide: a cat a token cost ~3% of a compiled step
        window, drawn, cache = idx[:, -n_ctx:], [], None
        for i in range(max_new_tokens):
            noise = None if temperature == 0 else race_noise(idx.shape[0], self.config.vocab_size, idx.device, generator)
            if cache is not None:  # only the newest token is new to the cache
                nxt = compiled(drawn[-1], cache, noise)
            else:  # read the whole window, filling a fresh cache if one is used
                cache = KVCache(self.config, idx.shape[0], n_ctx, idx.device, dtype) if use_cache else None
                read = compiled if i else step  # the prompt, read once, is not worth a graph of its own
                nxt = read(window, cache, noise)
            yield nxt
            drawn.append(nxt)
            if cache is None or window.shape[1] + len(drawn) > n_ctx:  # the next step reads the window
                window, drawn, cache = torch.cat((window, *drawn), dim=1), [], None
                if window.shape[1] > n_ctx:  # slide
                    window = window[:, -keep:]


def race_noise(batch_size, vocab_size, device, generator=None):
    """E ~ Exp(1), one per row and token: the randomness of a draw (see pick)."""
    return torch.empty(batch_size, vocab_size, device=device).exponential_(generator=generator)


def pick(logits, noise, temperature, top_k=None, top_p=None):
    """The token each row of logits (B, vocab) draws with noise from race_noise (None when greedy).

    The draw is exact: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is token i with probability p_i
    (the exponential race), and never a token of probability 0. torch.multinomial draws one sample
    this way too (the same tokens for a seed, torch 2.13), after checks of probs that cost ~30 us a
    token on CPU. With the noise drawn outside, the pick is pure arithmetic: a compiled decoding step
    runs it inside its graph (~9% a sampled token on the CPU model).
    """
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        # nucleus: keep the smallest set of most likely tokens whose mass reaches top_p
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already reached top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return (probs / noise).argmax(dim=-1, keepdim=True)
