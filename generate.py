"""The decoding engine: KV cache (dynamic, or static for CUDA graphs), the sliding window, the pick of the next
token, the compiled step.

It works on token ids and knows nothing of tokenizers; the model knows nothing of it beyond the
cache's update(layer, k, v) and length. sample.py, ablate.py and bench.py decode through generate().
"""

import torch
import torch.nn.functional as F

import positions


class KVCache:
    """Keys and values of every layer for positions [0, length), preallocated for max_len.

    One tensor per layer: a compiled decoding step then writes each in place, where with one all-layer
    tensor inductor copied the whole cache every token. One slot more than max_len is allocated and never
    used: the keys read are then never the whole tensor, a case torch.compile would otherwise compile a
    graph of its own for."""

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


class StaticKVCache:
    """A KV cache whose shapes never change, for a decoding step that CUDA graphs can replay: max_len slots per
    layer, and the position `length` as a 0-dim tensor on the device that the model advances in place.

    Each step writes its keys and values at `length` and attends over every slot; a tensor offset tells the
    attention and the positional schemes that the slots past the query are not written yet (positions.py), so
    they are masked as the future. Nothing is read back by the host: one graph serves every position. reset()
    starts a new window in the same tensors, which a CUDA graph keeps pointing at."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        if config.rope_scaling == "dynamic" and max_len > (config.rope_original_len or config.block_size):
            raise ValueError("static_cache cannot serve rope_scaling='dynamic' past the trained length: its "
                             "frequencies change with the length, which a static step does not know")
        shape = (batch_size, config.n_head, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.max_len = max_len
        # written in place, so a CUDA graph reads and writes these very tensors rather than copies; unguarded: a
        # new cache (the next generate call) makes the graph re-record, not the step recompile
        for t in (*self.k, *self.v, self.length):
            torch._dynamo.mark_static_address(t, guard=False)

    def reset(self):
        self.length.zero_()  # the old slots lie past the new position: masked until overwritten
        return self

    def update(self, layer, k, v):
        """Write this forward's k, v (B, nh, T, hs) at positions length..; return every slot (B, nh, max_len, hs)."""
        at = self.length + torch.arange(k.shape[2], device=k.device)
        self.k[layer].index_copy_(2, at, k)
        self.v[layer].index_copy_(2, at, v)
        return self.k[layer], self.v[layer]


def context_length(config, requested=None):
    """How many tokens generation may attend to: block_size unless asked for another length, which the
    positional scheme must be able to reach."""
    if requested is None or requested == config.block_size:
        return config.block_size
    if not positions.scheme(config.pos_emb).extrapolates:
        reach = ", ".join(name for name, cls in positions.SCHEMES.items() if cls.extrapolates)
        raise ValueError(f"max_context={requested} needs a scheme that extrapolates; {config.pos_emb} positions stop "
                         f"at block_size={config.block_size} (use {reach})")
    if requested < 1:
        raise ValueError(f"max_context={requested} must be a positive integer")
    return requested


@torch.inference_mode()  # lighter than no_grad: no version counters or views tracked
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
             use_cache=True, compile=False, generator=None, static_cache=False):
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

    static_cache=True decodes over a StaticKVCache of N slots instead, so that every step after a read of
    the window has the same shapes: compile=True then makes it one graph (static_step), which on CUDA is
    replayed as a CUDA graph, one launch a token instead of hundreds. The window's reads (the prompt, and
    after each slide) run eagerly. Greedy tokens are the dynamic cache's (tested).
    """
    if compile and not use_cache:
        raise ValueError("compile=True compiles the cached decoding; it needs use_cache=True")
    if static_cache and not use_cache:
        raise ValueError("static_cache=True is a kind of KV cache; it needs use_cache=True")
    n_ctx = context_length(model.config, max_context)
    keep = max(1, n_ctx // 2)
    device = idx.device.type
    # under autocast keys and values come out in the autocast dtype: the cache must hold that
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else model.wte.weight.dtype
    model.pos.reserve(n_ctx)  # the compiled step cannot grow a table

    def step(tokens, cache, noise):
        """Read tokens (after the cached ones) and pick the next one; compiled, the pick runs in the graph."""
        logits, _ = model(tokens, cache=cache)
        return pick(logits[:, -1, :], noise, temperature, top_k, top_p)

    static = StaticKVCache(model.config, idx.shape[0], n_ctx, idx.device, dtype) if static_cache else None
    if not compile:
        compiled = step
    elif static is not None:
        compiled = static_step(step, device)
    else:  # on CPU a C++ launcher (cpp_wrapper) saves inductor's Python one a call per token. Not dynamic=True:
        # with every size a symbol the step is slower than with only the cache length one
        compiled = torch.compile(step, options={"cpp_wrapper": device == "cpu"})
    # the model conditions on window + drawn. With the cache, tokens drawn since the window was read
    # join it only when it is read again, at a slide, rather than by a cat every token
    window, drawn, cache = idx[:, -n_ctx:], [], None
    for i in range(max_new_tokens):
        noise = None if temperature == 0 else race_noise(idx.shape[0], model.config.vocab_size, idx.device, generator)
        if cache is not None:  # only the newest token is new to the cache
            nxt = compiled(drawn[-1], cache, noise)
        elif static is not None:  # the window's read has another shape than the static step's: eager
            cache = static.reset()
            nxt = step(window, cache, noise)
        else:  # read the whole window, filling a fresh cache if one is used
            cache = KVCache(model.config, idx.shape[0], n_ctx, idx.device, dtype) if use_cache else None
            read = compiled if i else step  # the prompt, read once, is not worth a graph of its own
            nxt = read(window, cache, noise)
        yield nxt
        drawn.append(nxt)
        if cache is None or window.shape[1] + len(drawn) > n_ctx:  # the next step reads the window
            window, drawn, cache = torch.cat((window, *drawn), dim=1), [], None
            if window.shape[1] > n_ctx:  # slide
                window = window[:, -keep:]


def static_step(step, device):
    """step compiled as one whole graph of fixed shapes: on CUDA replayed as a CUDA graph (reduce-overhead), on the
    CPU with the C++ launcher. A CUDA graph's outputs live in memory its next replay overwrites: each token is
    copied out before the next step runs."""
    if device != "cuda":
        return torch.compile(step, fullgraph=True, options={"cpp_wrapper": True})
    graph = torch.compile(step, fullgraph=True, mode="reduce-overhead")

    def replay(tokens, cache, noise):
        torch.compiler.cudagraph_mark_step_begin()  # each call a new iteration: the last one's outputs may go
        return graph(tokens, cache, noise).clone()
    return replay


def race_noise(batch_size, vocab_size, device, generator=None):
    """E ~ Exp(1), one per row and token: the randomness of a draw (see pick)."""
    return torch.empty(batch_size, vocab_size, device=device).exponential_(generator=generator)


def pick(logits, noise, temperature, top_k=None, top_p=None):
    """The token each row of logits (B, vocab) draws with noise from race_noise (None when greedy).

    The draw is exact: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is token i with probability p_i
    (the exponential race), and never a token of probability 0. torch.multinomial draws one sample
    this way too (the same tokens for a seed), after checks of probs that cost time every token. With
    the noise drawn outside, the pick is pure arithmetic that a compiled decoding step runs in its graph.
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
