"""Generate text from a trained model, or from several side by side.

    python sample.py                                       the run in out/ (else the newest out*/ here)
    python sample.py --out_dir=out-rope --start="ROMEO:" --max_new_tokens=500 --seed=1
    python sample.py --start=FILE:prompt.txt --temperature=0      greedy, the prompt read from a file
    python sample.py --compare=out-rope,out-sinusoidal --seed=1 [--format=markdown]

One model: the text streams to stdout as it is drawn; the model and the speed go to stderr.
--compare: the same prompt and seed through each model, then a table of each model's positional
scheme, parameters, best val loss, loss on the prompt and tokens/s, and the samples side by side.
A model is a run folder, a checkpoint file or hf:NAME_OR_PATH (a transformers GPT-2 or GPT-NeoX).
"""

import math
import os
import shutil
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch
from tqdm import tqdm

import config
import scalings
from config import NON_NEGATIVE, POSITIVE, one_of, opt
from data.tokenizer import tokenizer_from_meta
from generate import Sampling, context_length, generate
from runtime import check_compile, decode_autocast, pick_device
from source import SourceSettings, load_source

FORMATS = ("columns", "text", "markdown")
MIN_COLUMN = 24  # narrower columns wrap the text into confetti: print blocks instead
SEPARATOR = "-" * 40  # between samples of one model


# ----------------------------------------------------------------------------- settings


@dataclass
class SampleConfig(SourceSettings):
    compare: str = opt("", "models to sample side by side, comma-separated (run folders, files or hf:NAME_OR_PATH)")
    start: str = opt("\n", "prompt text, or FILE:path; empty starts from the start token")
    num_samples: int = opt(1, "samples per model", check=POSITIVE)
    max_new_tokens: int = opt(500, "tokens to generate per sample", check=POSITIVE)
    temperature: float = opt(0.8, "0 is greedy; higher is more random", check=NON_NEGATIVE)
    top_k: int | None = opt(None, "sample among the k most likely tokens", check=POSITIVE)
    top_p: float | None = opt(
        None,
        "nucleus sampling: the smallest set of tokens with this much probability",
        check=("lie in (0, 1]", lambda v: 0 < v <= 1),
    )
    seed: int = opt(1337, "same seed, same text")
    max_context: int | None = opt(
        None,
        "tokens attended to (default block_size; more lets rope, alibi, none, sinusoidal run past the trained length)",
        check=POSITIVE,
    )
    kv_cache: bool = opt(True, "reuse keys and values across steps")
    compile: bool = opt(
        False,
        "torch.compile the cached decoding: several times the tokens/s of a small model on "
        "CPU after a compile of seconds to a minute (docs/benchmarks.md), so worth it for "
        "long or many samples",
    )
    static_cache: bool = opt(
        False,
        "decode over a fixed-size KV cache, one static-shape step: with compile on CUDA "
        "that step is replayed as a CUDA graph (torch.compile's reduce-overhead)",
    )
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps")
    format: str = opt(
        "columns",
        "how --compare prints: samples side by side, one block per model, or a markdown table",
        check=one_of(FORMATS),
    )

    def __post_init__(self):
        super().__post_init__()
        if self.out_dir and self.compare:
            raise ValueError("out_dir and compare exclude each other: sample one model, or compare several")
        if self.compile and not self.kv_cache:
            raise ValueError("compile=true compiles the cached decoding; it needs kv_cache=true")
        if self.static_cache and not self.kv_cache:
            raise ValueError("static_cache=true is a kind of KV cache; it needs kv_cache=true")


def read_prompt(start):
    if not start.startswith("FILE:"):
        return start
    path = Path(start.removeprefix("FILE:"))
    if not path.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist (--start=FILE:path reads a text file)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"prompt file {str(path)!r} is not UTF-8 text") from None


# ----------------------------------------------------------------------------- models


class Sampler:
    """One model ready to sample: the model (with any sampling-time RoPE scaling), tokenizer and prompt ids."""

    def __init__(self, spec, flag, prompt, sample_cfg, device):
        self.name = spec
        source = load_source(spec, flag, sample_cfg.checkpoint)
        self.path, self.info, meta = source.label, source.info, source.meta
        self.model = source.model(device).eval()
        self.tok = tokenizer_from_meta(meta)
        model_cfg = self.model.config
        try:
            self.max_context = context_length(model_cfg, sample_cfg.max_context)
            if model_cfg.takes("rope_scaling"):  # a scaling without its factor stretches L0 to max_context
                sample_cfg.rescale(self.model, stretch=max(1.0, self.max_context / model_cfg.L0))
            ids = self.tok.encode(prompt) if prompt else []
        except ValueError as e:
            raise ValueError(f"{flag}={spec}: {e}") from None
        self.start_id = meta["start_id"]
        self.prompt_ids = ids
        self.ids = torch.tensor([ids or [self.start_id]], dtype=torch.long, device=device)  # (1, T)

    @property
    def scheme(self):
        """The positional scheme, with the RoPE scaling in force if any."""
        model_cfg = self.model.config
        if not scalings.is_scaled(model_cfg):
            return model_cfg.pos_emb
        return f"{model_cfg.pos_emb} ({model_cfg.rope_scaling} x{model_cfg.rope_scaling_factor:g})"

    def describe(self):
        return (
            f"{self.path}: pos_emb={self.scheme}, {count(self.model.num_params())} params, "
            f"iter {self.info.get('iter') or '?'}, best val loss {fmt(self.info.get('best_val_loss'))}"
        )

    @torch.inference_mode()
    def prompt_loss(self):
        """Mean cross-entropy (nats/token) of the prompt, its first token predicted from the start token:
        how surprised the model is by the prompt. None for an empty prompt; a long one is scored on its
        last max_context tokens."""
        if not self.prompt_ids:
            return None
        ids = torch.tensor([[self.start_id, *self.prompt_ids]], device=self.ids.device)[:, -self.max_context - 1 :]
        return self.model(ids[:, :-1], ids[:, 1:])[1].item()

    def sample(self, sample_cfg, generator, on_token=None, write=None):
        """Draw one sample, passing text to write as it becomes whole; returns (text, tokens per second)."""
        out, pending = [], []  # pending: drawn but not yet written, only the tail is ever decoded
        t0 = time.perf_counter()
        sampling = Sampling(sample_cfg.temperature, sample_cfg.top_k, sample_cfg.top_p)
        cache = "static" if sample_cfg.static_cache else "dynamic" if sample_cfg.kv_cache else "none"
        for nxt in generate(
            self.model,
            self.ids,
            sample_cfg.max_new_tokens,
            sampling,
            cache,
            sample_cfg.compile,
            sample_cfg.max_context,
            generator,
        ):
            out.append(nxt.item())
            if on_token:
                on_token()
            if write:
                pending.append(out[-1])
                piece = self.tok.decode(pending)
                if not piece.endswith("\ufffd"):  # a byte-level token may end mid-character: wait for the rest
                    write(piece)
                    pending.clear()
        rate = len(out) / (time.perf_counter() - t0)
        if write and pending:
            write(self.tok.decode(pending))
        return self.tok.decode(out), rate


def decoding(sample_cfg):
    """How tokens are drawn, for the speed reports: a compiled decoding's first sample includes the compile."""
    if not sample_cfg.kv_cache:
        return "kv cache off"
    cache = "static kv cache" if sample_cfg.static_cache else "kv cache on"
    return f"{cache}, compiled: the first sample's rate includes compiling" if sample_cfg.compile else cache


def generator_for(seed, device):
    """Each model's draws start from the seed, so every model, and every run, gets the same random numbers."""
    return torch.Generator(device=device).manual_seed(seed)


def load_all(specs, flag, prompt, sample_cfg, device):
    samplers = [Sampler(spec, flag, prompt, sample_cfg, device) for spec in specs]
    if sample_cfg.rope_scaling and not any(s.model.config.takes("rope_scaling") for s in samplers):
        schemes = ", ".join(f"{s.name} uses pos_emb={s.model.config.pos_emb}" for s in samplers)
        raise ValueError(f"rope_scaling={sample_cfg.rope_scaling} needs a RoPE model; {schemes}")
    return samplers


# ----------------------------------------------------------------------------- one model, streamed


def sample_one(sample_cfg, prompt, device, reason):
    (m,) = load_all([sample_cfg.spec()], "out_dir", prompt, sample_cfg, device)
    print(f"{m.describe()}; device {device} ({reason})", file=sys.stderr)
    g = generator_for(sample_cfg.seed, device)

    def write(s):
        sys.stdout.write(s)
        sys.stdout.flush()

    rates = []
    for i in range(sample_cfg.num_samples):
        if i:
            write(SEPARATOR + "\n")
        write(prompt)
        rates.append(m.sample(sample_cfg, g, write=write)[1])
        write("\n")
    print(
        f"{sample_cfg.max_new_tokens} new tokens per sample at {statistics.median(rates):,.0f} tokens/s "
        f"({decoding(sample_cfg)})",
        file=sys.stderr,
    )


# ----------------------------------------------------------------------------- several models, compared


def compare(sample_cfg, prompt, device, reason):
    samplers = load_all(
        [c.strip() for c in sample_cfg.compare.split(",") if c.strip()], "compare", prompt, sample_cfg, device
    )
    print(f"device {device} ({reason})", file=sys.stderr)
    total = len(samplers) * sample_cfg.num_samples * sample_cfg.max_new_tokens
    rows = []
    with tqdm(total=total, desc="sampling", unit="tok", leave=False, disable=None) as bar:
        for m in samplers:
            g = generator_for(sample_cfg.seed, device)
            texts, rates = zip(
                *(m.sample(sample_cfg, g, on_token=bar.update) for _ in range(sample_cfg.num_samples)), strict=True
            )
            rows.append(
                {
                    "model": m.name,
                    "pos_emb": m.scheme,
                    "params": count(m.model.num_params()),
                    "iters": str(m.info.get("iter") or "?"),
                    "best val loss": fmt(m.info.get("best_val_loss")),
                    "prompt loss": fmt(m.prompt_loss()),
                    "tokens/s": f"{statistics.median(rates):,.0f}",
                    "samples": [prompt + t for t in texts],
                }
            )
    show = {"markdown": as_markdown, "text": as_blocks, "columns": as_columns}[sample_cfg.format]
    print(show(rows, settings(sample_cfg, prompt)))


STATS = ("model", "pos_emb", "params", "iters", "best val loss", "prompt loss", "tokens/s")


def settings(sample_cfg, prompt):
    shown = repr(prompt if len(prompt) <= 60 else prompt[:57] + "...")
    return (
        f"prompt {shown} ({len(prompt)} chars)\nseed {sample_cfg.seed}, temperature {sample_cfg.temperature:g}, "
        f"top_k {sample_cfg.top_k or '-'}, top_p {sample_cfg.top_p or '-'}, {sample_cfg.max_new_tokens} new tokens, "
        f"context {sample_cfg.max_context or 'block_size'}, {decoding(sample_cfg)}; "
        f"prompt loss in nats/token"
    )


def stats_table(rows):
    """The STATS of each model as aligned text columns."""
    table = [STATS] + [tuple(r[k] for k in STATS) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(STATS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table)


def as_blocks(rows, head):
    blocks = [f"=== {r['model']} ({r['pos_emb']}) ===\n" + f"\n{SEPARATOR}\n".join(r["samples"]) for r in rows]
    return "\n\n".join([head, stats_table(rows), *blocks])


def as_columns(rows, head):
    gap = " | "
    width = (shutil.get_terminal_size((120, 24)).columns - len(gap) * (len(rows) - 1)) // len(rows)
    if width < MIN_COLUMN:
        return as_blocks(rows, head)
    lines = [[clip(f"{r['model']} ({r['pos_emb']})", width) for r in rows]]  # each line: one cell per model
    for samples in zip(*(r["samples"] for r in rows), strict=True):  # the models' first samples, then their second ...
        lines += [["-" * width] * len(rows), *zip_longest(*(wrap(s, width) for s in samples), fillvalue="")]
    text = "\n".join(gap.join(cell.ljust(width) for cell in line).rstrip() for line in lines)
    return "\n\n".join([head, stats_table(rows), text])


def clip(text, width):
    """text in at most width characters, keeping its end (where run folder names differ)."""
    return text if len(text) <= width else "..." + text[3 - width :]


def wrap(text, width):
    """text as lines of at most width characters, its own line breaks kept."""
    return [piece for line in text.expandtabs().split("\n") for piece in textwrap.wrap(line, width) or [""]]


def as_markdown(rows, head):
    def cell(text):  # a table cell: markdown's specials escaped, line breaks as <br>
        for ch in "\\`*_[]<>|~&":
            text = text.replace(ch, "\\" + ch)
        return text.replace("\n", "<br>")

    def line(cells):
        return "| " + " | ".join(cells) + " |"

    lines = [cell(head), "", line(STATS), "|---|---|" + "---:|" * (len(STATS) - 2)]
    lines += [line(cell(r[k]) for k in STATS) for r in rows]
    lines += ["", line(cell(f"{r['model']} ({r['pos_emb']})") for r in rows), "|---" * len(rows) + "|"]
    lines += [line(map(cell, samples)) for samples in zip(*(r["samples"] for r in rows), strict=True)]
    return "\n".join(lines)


def count(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def fmt(x):
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"


# ----------------------------------------------------------------------------- main


def sample(sample_cfg):
    prompt = read_prompt(sample_cfg.start)
    device, reason = pick_device(sample_cfg.device)
    check_compile(sample_cfg.compile, device.split(":")[0])
    with decode_autocast(device.split(":")[0]):
        (compare if sample_cfg.compare else sample_one)(sample_cfg, prompt, device, reason)


def main(argv=None):
    try:
        config.main(argv, __doc__, (SampleConfig,), sample)
    except BrokenPipeError:  # the reader (e.g. `| head`) left: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(0)


if __name__ == "__main__":
    main()
