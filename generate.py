"""The decoding engine: how the next token is drawn (Sampling), the KV caches (dynamic, or static for CUDA graphs),
the three ways of decoding (Recompute, Cached, Static), the sliding window, the compiled step.

It works on token ids and knows nothing of tokenizers; the model knows nothing of it beyond a cache's span and
update (the decoder advances the cache after each forward). sample.py, the lab and bench.py decode through
generate().
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import scalings
import spans
from model import all_schemes, scheme_class


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: greedy at temperature 0, else from the tempered distribution, truncated to the
    top_k most likely tokens and to the top_p mass (nucleus)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def noise(self, batch_size, vocab_size, device, generator=None):
        """E ~ Exp(1), one per row and token: the randomness of a draw (see pick); None when greedy."""
        if self.temperature == 0:
            return None
        return torch.empty(batch_size, vocab_size, device=device).exponential_(generator=generator)

    def pick(self, logits, noise):
        """The token each row of logits (B, vocab) draws with noise from self.noise.

        The draw is exact: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is token i with probability p_i
        (the exponential race), and never a token of probability 0. torch.multinomial draws one sample
        this way too (the same tokens for a seed), after checks of probs that cost time every token. With
        the noise drawn outside, the pick is pure arithmetic that a compiled decoding step runs in its graph.
        """
        if self.temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < logits.size(-1):
            kth = torch.topk(logits, self.top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1)
        if self.top_p is not None and self.top_p < 1.0:
            # nucleus: keep the smallest set of most likely tokens whose mass reaches top_p
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p  # mass before this token already reached top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        return (probs / noise).argmax(dim=-1, keepdim=True)


GREEDY = Sampling(temperature=0)


# ----------------------------------------------------------------------------- the caches


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
        self.ids = torch.zeros((batch_size, max_len + 1), dtype=torch.long, device=device)  # rows' own positions
        self.max_len = max_len
        self.length = 0  # tokens filled and committed by earlier forwards

    def span(self, T, ids=None):
        """T new tokens after the cached ones, at ids (B, T) where rows have positions of their own (stored beside
        their keys); the keys are all of them."""
        end = self.length + T
        assert end <= self.max_len, f"KV cache overflow: {end} > {self.max_len}"
        if ids is None:
            return spans.Span(self.length, T, end, self.k[0].device)
        self.ids[:, self.length : end] = ids
        return spans.Span(self.length, T, end, self.k[0].device, ids=ids, key_ids=self.ids[:, :end])

    def update(self, layer, k, v):
        """Store this forward's k, v (B, nh, T, hs) after the cached ones; return all of them."""
        start, end = self.length, self.length + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, T):
        self.length += T


class StaticKVCache:
    """A KV cache whose shapes never change, for a decoding step that CUDA graphs can replay: max_len slots per
    layer, and the position `length` as a 0-dim tensor on the device, which the step advances in place.

    Each step writes its keys and values at `length` and attends over every slot; its spans.Span (a tensor
    start) tells the attention and the positional schemes that the slots past the query are not written yet, so
    they are masked as the future. Nothing is read back by the host: one graph serves every position. reset()
    starts a new window in the same tensors, which a CUDA graph keeps pointing at."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        if scalings.scaling_of(config).dynamic and max_len > config.L0:
            raise ValueError(
                f"static_cache cannot serve rope_scaling={config.rope_scaling!r} past the trained length: "
                "its frequencies change with the length, which a static step does not know"
            )
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

    def span(self, T, ids=None):
        """T new tokens at `length`, which the host never reads; the keys are every slot."""
        if ids is not None:
            raise ValueError("static_cache takes no per-row position ids; decode them with a dynamic KV cache")
        return spans.Span(self.length, T, self.max_len, self.length.device)

    def update(self, layer, k, v):
        """Write this forward's k, v (B, nh, T, hs) at positions length..; return every slot (B, nh, max_len, hs)."""
        at = self.length + torch.arange(k.shape[2], device=k.device)
        self.k[layer].index_copy_(2, at, k)
        self.v[layer].index_copy_(2, at, v)
        return self.k[layer], self.v[layer]

    def advance(self, T):
        self.length.add_(T)  # in place: a CUDA graph reads this very tensor


def context_length(config, requested=None):
    """How many tokens generation may attend to: block_size unless asked for another length, which the
    positional scheme must be able to reach."""
    if requested is None or requested == config.block_size:
        return config.block_size
    if not scheme_class(config.pos_emb).extrapolates:
        reach = ", ".join(name for name, cls in all_schemes().items() if cls.extrapolates)
        raise ValueError(
            f"max_context={requested} needs a scheme that extrapolates; {config.pos_emb} positions stop "
            f"at block_size={config.block_size} (use {reach})"
        )
    if requested < 1:
        raise ValueError(f"max_context={requested} must be a positive integer")
    return requested


# ----------------------------------------------------------------------------- the ways of decoding


class Decoder:
    """A way of decoding: read(window) reads a whole window (into a fresh cache, if any) and picks the token after
    it; step(token) reads one token the cache has not seen and picks the next. Without a cache (caches False)
    every token is a read."""

    caches = True

    def __init__(self, model, sampling):
        self.model, self.sampling = model, sampling

    def forward_pick(self, tokens, cache, noise, ids=None):
        """Read tokens (after the cached ones, at each row's position ids if given) and pick the next one;
        compiled, the pick runs in the graph."""
        logits, _ = self.model(tokens, cache=cache, position_ids=ids)
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.sampling.pick(logits[:, -1, :], noise)

    def step(self, token, noise, ids=None):
        return self.compiled(token, self.cache, noise, ids)


class Recompute(Decoder):
    """No cache: every token reads the whole window again. The reference the caches are tested against."""

    caches = False

    def __init__(self, model, sampling, batch_size, n_ctx, dtype, compile):
        if compile:
            raise ValueError("compile=True compiles the cached decoding; it needs a cache (dynamic or static)")
        super().__init__(model, sampling)

    def read(self, window, noise, ids=None):
        return self.forward_pick(window, None, noise, ids)


class Cached(Decoder):
    """A KVCache of the window: after its read, each step reads only the newest token.

    compile=True runs the steps after the prompt (a forward and the pick) through torch.compile: a small model's
    step is mostly per-operation overhead, which fused graphs remove (bench.py measures both). Three graphs serve
    every position: the first step, the later steps (torch.compile sees the cache length change and makes it a
    symbol) and the window's re-read after a slide. The prompt is read once, eagerly. Compiled sampling draws the
    same tokens for a seed as eager unless two candidates tie within float rounding."""

    def __init__(self, model, sampling, batch_size, n_ctx, dtype, compile):
        super().__init__(model, sampling)
        device = model.wte.weight.device
        self.new_cache = lambda: KVCache(model.config, batch_size, n_ctx, device, dtype)
        # on CPU a C++ launcher (cpp_wrapper) saves inductor's Python one a call per token. Not dynamic=True: with
        # every size a symbol the step is slower than with only the cache length one
        self.compiled = (
            torch.compile(self.forward_pick, options={"cpp_wrapper": device.type == "cpu"})
            if compile
            else self.forward_pick
        )
        self.cache, self.reads = None, 0

    def read(self, window, noise, ids=None):
        self.cache = self.new_cache()
        read = self.compiled if self.reads else self.forward_pick  # the prompt, read once, is not worth a graph
        self.reads += 1
        return read(window, self.cache, noise, ids)


class Static(Decoder):
    """A StaticKVCache of the window, so that every step after a read has the same shapes: compile=True makes it
    one graph (static_step), which on CUDA is replayed as a CUDA graph, one launch a token instead of hundreds.
    The window's reads (the prompt, and after each slide) run eagerly. Greedy tokens are the dynamic cache's."""

    def __init__(self, model, sampling, batch_size, n_ctx, dtype, compile):
        super().__init__(model, sampling)
        device = model.wte.weight.device
        self.cache = StaticKVCache(model.config, batch_size, n_ctx, device, dtype)
        self.compiled = static_step(self.forward_pick, device.type) if compile else self.forward_pick

    def read(self, window, noise, ids=None):  # another shape than the static step's: eager
        return self.forward_pick(window, self.cache.reset(), noise, ids)


DECODERS = {"dynamic": Cached, "static": Static, "none": Recompute}  # generate's cache= values


def static_step(step, device):
    """step compiled as one whole graph of fixed shapes: on CUDA replayed as a CUDA graph (reduce-overhead), on the
    CPU with the C++ launcher. A CUDA graph's outputs live in memory its next replay overwrites: each token is
    copied out before the next step runs."""
    if device != "cuda":
        return torch.compile(step, fullgraph=True, options={"cpp_wrapper": True})
    graph = torch.compile(step, fullgraph=True, mode="reduce-overhead")

    def replay(tokens, cache, noise, ids=None):
        torch.compiler.cudagraph_mark_step_begin()  # each call a new iteration: the last one's outputs may go
        return graph(tokens, cache, noise, ids).clone()

    return replay


# ----------------------------------------------------------------------------- generation


@torch.inference_mode()  # lighter than no_grad: no version counters or views tracked
def generate(
    model,
    idx,
    max_new_tokens,
    sampling=Sampling(),
    cache="dynamic",
    compile=False,
    max_context=None,
    generator=None,
    position_ids=None,
):
    """Draw max_new_tokens after the prompt idx (B, T) as sampling says, with generator's random numbers; yields
    each new token (B, 1) as it is drawn. cache is one of DECODERS: dynamic (a KV cache), static (fixed shapes,
    for CUDA graphs) or none (every token recomputed); compile=True compiles the cached steps. position_ids
    (B, T), increasing along each row, gives the prompt's rows positions of their own; each new token takes the
    position after its row's last.

    When the text outgrows the context N (max_context, default block_size), the window slides: the newest N//2
    tokens are kept and re-read from position 0. Every way of decoding shares this rule, so greedy decoding gives
    identical tokens with any cache.
    """
    if cache not in DECODERS:
        raise ValueError(f"cache={cache!r} is unknown; choose one of {', '.join(DECODERS)}")
    n_ctx = context_length(model.config, max_context)
    keep = max(1, n_ctx // 2)
    device = idx.device.type
    # under autocast keys and values come out in the autocast dtype: the cache must hold that
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else model.wte.weight.dtype
    model.scheme.reserve(n_ctx)  # the compiled step cannot grow a table
    decoder = DECODERS[cache](model, sampling, idx.shape[0], n_ctx, dtype, compile)
    # the model conditions on window + drawn. With a cache, tokens drawn since the window was read join it only
    # when it is read again, at a slide, rather than by a cat every token
    window, drawn, fresh = idx[:, -n_ctx:], [], True
    ids = None if position_ids is None else position_ids[:, -n_ctx:]  # (B, T): the window's positions
    for _ in range(max_new_tokens):
        noise = sampling.noise(idx.shape[0], model.config.vocab_size, idx.device, generator)
        if fresh:
            nxt = decoder.read(window, noise, ids)
        else:  # the newest drawn token, at the position len(drawn) after the window's last
            nxt = decoder.step(drawn[-1], noise, None if ids is None else ids[:, -1:] + len(drawn))
        yield nxt
        drawn.append(nxt)
        fresh = not decoder.caches or window.shape[1] + len(drawn) > n_ctx
        if fresh:  # the next step reads the window again
            if ids is not None:
                ids = torch.cat((ids, ids[:, -1:] + 1 + torch.arange(len(drawn), device=idx.device)), dim=1)
            window, drawn = torch.cat((window, *drawn), dim=1), []
            if window.shape[1] > n_ctx:  # slide
                window = window[:, -keep:]
                ids = None if ids is None else ids[:, -keep:] - ids[:, -keep:][:, :1]  # from 0, gaps kept
