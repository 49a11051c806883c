"""Generate text from a trained model, or from several side by side.

    python sample.py                                       the run in out/ (else the newest out*/ here)
    python sample.py --out_dir=out-rope --start="ROMEO:" --max_new_tokens=500 --seed=1
    python sample.py --start=FILE:prompt.txt --temperature=0      greedy, the prompt read from a file
    python sample.py --compare out-rope out-sinusoidal --seed=1 [--format=markdown]

One model: the text streams to stdout as it is drawn; the model and the speed go to stderr.
--compare: the same prompt and seed through each model, then a table of each model's positional
scheme, parameters, best val loss, loss on the prompt and tokens/s, and the samples side by side.
"""

import argparse
import math
import os
import shutil
import statistics
import sys
import textwrap
import time
from itertools import zip_longest
from pathlib import Path

import torch
from tqdm import tqdm

import config
import hf
import rope
from checkpoint import CHECKPOINTS, checkpoint_in, load_run, model_from_checkpoint
from data.tokenizer import tokenizer_from_meta
from generate import Sampling, context_length, generate
from runtime import check_compile, decode_autocast, pick_device

FORMATS = ("columns", "text", "markdown")
MIN_COLUMN = 24  # narrower columns wrap the text into confetti: print blocks instead
SEPARATOR = "-" * 40  # between samples of one model


# ----------------------------------------------------------------------------- arguments

non_negative_float = config.checked(float, lambda v: math.isfinite(v) and v >= 0, "a temperature >= 0 (0 is greedy)")
unit_mass = config.checked(float, lambda v: 0 < v <= 1, "a probability mass in (0, 1]")
true_false = config.checked(lambda t: config.coerce("", t, bool), lambda v: True, "true or false")


def arg_parser():
    p = config.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out_dir", help="run folder holding best.pt / ckpt.pt (default: out, else the newest "
                                         "out*/ folder here with a checkpoint), or hf:NAME_OR_PATH, a transformers "
                                         "GPT-2 or GPT-NeoX checkpoint")
    where.add_argument("--compare", nargs="+", metavar="DIR", help="run folders (or hf:NAME_OR_PATH) to sample side "
                                                                   "by side")
    p.add_argument("--checkpoint", choices=tuple(CHECKPOINTS), default="best", help="best.pt or ckpt.pt (latest)")
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path; empty starts from the start token")
    p.add_argument("--num_samples", type=config.positive_int, default=1, help="samples per model")
    p.add_argument("--max_new_tokens", type=config.positive_int, default=500, help="tokens to generate per sample")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy; higher is more random")
    p.add_argument("--top_k", type=config.positive_int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top_p", type=unit_mass, default=None,
                   help="nucleus sampling: the smallest set of tokens with this much probability, in (0, 1]")
    p.add_argument("--seed", type=int, default=1337, help="same seed, same text")
    p.add_argument("--max_context", type=config.positive_int, default=None,
                   help="tokens attended to (default block_size; more lets rope, alibi, none, sinusoidal "
                        "run past the trained length)")
    p.add_argument("--rope_scaling", choices=tuple(rope.SCALINGS), default=None,
                   help="RoPE scaling at sampling time (RoPE models only)")
    p.add_argument("--rope_scaling_factor", type=float, default=None,
                   help="its factor (default max_context / block_size, at least 1)")
    p.add_argument("--kv_cache", type=true_false, nargs="?", const=True, default=True,
                   help="reuse keys and values across steps (true/false)")
    p.add_argument("--compile", type=true_false, nargs="?", const=True, default=False,
                   help="torch.compile the cached decoding (true/false): several times the tokens/s of a small "
                        "model on CPU after a compile of seconds to a minute (README: Benchmarks), so worth it for "
                        "long or many samples")
    p.add_argument("--static_cache", type=true_false, nargs="?", const=True, default=False,
                   help="decode over a fixed-size KV cache, one static-shape step (true/false): with --compile on "
                        "CUDA that step is replayed as a CUDA graph (torch.compile's reduce-overhead)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--format", choices=FORMATS, default="columns",
                   help="how --compare prints: samples side by side, one block per model, or a markdown table")
    return p


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

def default_run(which):
    """out/ (train.py's default), else the newest out*/ folder in the working directory: the run just trained."""
    runs = [p for p in Path().glob("out*") if p.is_dir() and checkpoint_in(p, which)]
    if not runs:
        raise ValueError("no checkpoint in out/ or any other out*/ folder here; train a model first "
                         "(python train.py ...) or name its folder with --out_dir")
    out = Path("out")
    return out if out in runs else max(runs, key=lambda p: checkpoint_in(p, which).stat().st_mtime)


class Sampler:
    """One checkpoint ready to sample: the model (with any sampling-time RoPE scaling), tokenizer and prompt ids."""

    def __init__(self, out_dir, prompt, args, device):
        self.name = str(out_dir)
        if self.name.startswith(hf.PREFIX):  # a transformers checkpoint, with its own tokenizer
            self.path = self.name
            self.model, meta = hf.pretrained(self.name.removeprefix(hf.PREFIX), device)
            self.ckpt = {"tokenizer": meta}
        else:
            self.path, self.ckpt = load_run(out_dir, args.checkpoint, device)
            self.model = model_from_checkpoint(self.ckpt, device, self.path).eval()
        self.tok = tokenizer_from_meta(self.ckpt["tokenizer"])
        cfg = self.model.config
        try:
            self.max_context = context_length(cfg, args.max_context)
            if args.rope_scaling in self.model.pos.scalings:
                factor = args.rope_scaling_factor or max(1.0, self.max_context / cfg.block_size)
                self.model.reconfigure(rope_scaling=args.rope_scaling, rope_scaling_factor=factor)
            ids = self.tok.encode(prompt) if prompt else []
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None
        self.start_id = self.ckpt["tokenizer"]["start_id"]
        self.prompt_ids = ids
        self.ids = torch.tensor([ids or [self.start_id]], dtype=torch.long, device=device)  # (1, T)

    @property
    def scheme(self):
        """The positional scheme, with the RoPE scaling in force if any."""
        cfg = self.model.config
        if not cfg.scaled:
            return cfg.pos_emb
        return f"{cfg.pos_emb} ({cfg.rope_scaling} x{cfg.rope_scaling_factor:g})"

    def describe(self):
        return (f"{self.path}: pos_emb={self.scheme}, {count(self.model.num_params())} params, "
                f"iter {self.ckpt.get('iter', '?')}, best val loss {fmt(self.ckpt.get('best_val_loss'))}")

    @torch.inference_mode()
    def prompt_loss(self):
        """Mean cross-entropy (nats/token) of the prompt, its first token predicted from the start token:
        how surprised the model is by the prompt. None for an empty prompt; a long one is scored on its
        last max_context tokens."""
        if not self.prompt_ids:
            return None
        ids = torch.tensor([[self.start_id, *self.prompt_ids]], device=self.ids.device)[:, -self.max_context - 1:]
        return self.model(ids[:, :-1], ids[:, 1:])[1].item()

    def sample(self, args, generator, on_token=None, write=None):
        """Draw one sample, passing text to write as it becomes whole; returns (text, tokens per second)."""
        out, pending = [], []  # pending: drawn but not yet written, only the tail is ever decoded
        t0 = time.perf_counter()
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        cache = "static" if args.static_cache else "dynamic" if args.kv_cache else "none"
        for nxt in generate(self.model, self.ids, args.max_new_tokens, sampling, cache, args.compile, args.max_context,
                            generator):
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


def decoding(args):
    """How tokens are drawn, for the speed reports: a compiled decoding's first sample includes the compile."""
    if not args.kv_cache:
        return "kv cache off"
    cache = "static kv cache" if args.static_cache else "kv cache on"
    return f"{cache}, compiled: the first sample's rate includes compiling" if args.compile else cache


def generator_for(seed, device):
    """Each model's draws start from the seed, so every model, and every run, gets the same random numbers."""
    return torch.Generator(device=device).manual_seed(seed)


def load_all(dirs, prompt, args, device):
    if args.rope_scaling_factor is not None and not args.rope_scaling:
        raise ValueError(f"--rope_scaling_factor={args.rope_scaling_factor} needs --rope_scaling "
                         f"({', '.join(rope.SCALINGS)})")
    samplers = [Sampler(d, prompt, args, device) for d in dirs]
    if args.rope_scaling and not any(args.rope_scaling in s.model.pos.scalings for s in samplers):
        schemes = ", ".join(f"{s.name} uses pos_emb={s.model.config.pos_emb}" for s in samplers)
        raise ValueError(f"--rope_scaling={args.rope_scaling} needs a RoPE model; {schemes}")
    return samplers


# ----------------------------------------------------------------------------- one model, streamed

def sample_one(args, prompt, device, reason):
    (m,) = load_all([args.out_dir or default_run(args.checkpoint)], prompt, args, device)
    print(f"{m.describe()}; device {device} ({reason})", file=sys.stderr)
    g = generator_for(args.seed, device)

    def write(s):
        sys.stdout.write(s)
        sys.stdout.flush()

    rates = []
    for i in range(args.num_samples):
        if i:
            write(SEPARATOR + "\n")
        write(prompt)
        rates.append(m.sample(args, g, write=write)[1])
        write("\n")
    print(f"{args.max_new_tokens} new tokens per sample at {statistics.median(rates):,.0f} tokens/s "
          f"({decoding(args)})", file=sys.stderr)


# ----------------------------------------------------------------------------- several models, compared

def compare(args, prompt, device, reason):
    samplers = load_all(args.compare, prompt, args, device)
    print(f"device {device} ({reason})", file=sys.stderr)
    total = len(samplers) * args.num_samples * args.max_new_tokens
    rows = []
    with tqdm(total=total, desc="sampling", unit="tok", leave=False, disable=None) as bar:
        for m in samplers:
            g = generator_for(args.seed, device)
            texts, rates = zip(*(m.sample(args, g, on_token=bar.update) for _ in range(args.num_samples)))
            rows.append({"model": m.name, "pos_emb": m.scheme, "params": count(m.model.num_params()),
                         "iters": str(m.ckpt.get("iter", "?")), "best val loss": fmt(m.ckpt.get("best_val_loss")),
                         "prompt loss": fmt(m.prompt_loss()), "tokens/s": f"{statistics.median(rates):,.0f}",
                         "samples": [prompt + t for t in texts]})
    show = {"markdown": as_markdown, "text": as_blocks, "columns": as_columns}[args.format]
    print(show(rows, settings(args, prompt)))


STATS = ("model", "pos_emb", "params", "iters", "best val loss", "prompt loss", "tokens/s")


def settings(args, prompt):
    shown = repr(prompt if len(prompt) <= 60 else prompt[:57] + "...")
    return (f"prompt {shown} ({len(prompt)} chars)\nseed {args.seed}, temperature {args.temperature:g}, "
            f"top_k {args.top_k or '-'}, top_p {args.top_p or '-'}, {args.max_new_tokens} new tokens, "
            f"context {args.max_context or 'block_size'}, {decoding(args)}; "
            f"prompt loss in nats/token")


def stats_table(rows):
    """The STATS of each model as aligned text columns."""
    table = [STATS] + [tuple(r[k] for k in STATS) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(STATS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def as_blocks(rows, head):
    blocks = [f"=== {r['model']} ({r['pos_emb']}) ===\n" + f"\n{SEPARATOR}\n".join(r["samples"]) for r in rows]
    return "\n\n".join([head, stats_table(rows), *blocks])


def as_columns(rows, head):
    gap = " | "
    width = (shutil.get_terminal_size((120, 24)).columns - len(gap) * (len(rows) - 1)) // len(rows)
    if width < MIN_COLUMN:
        return as_blocks(rows, head)
    lines = [[clip(f"{r['model']} ({r['pos_emb']})", width) for r in rows]]  # each line: one cell per model
    for samples in zip(*(r["samples"] for r in rows)):  # the models' first samples, then their second ...
        lines += [["-" * width] * len(rows), *zip_longest(*(wrap(s, width) for s in samples), fillvalue="")]
    text = "\n".join(gap.join(cell.ljust(width) for cell in line).rstrip() for line in lines)
    return "\n\n".join([head, stats_table(rows), text])


def clip(text, width):
    """text in at most width characters, keeping its end (where run folder names differ)."""
    return text if len(text) <= width else "..." + text[3 - width:]


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
    lines += [line(map(cell, samples)) for samples in zip(*(r["samples"] for r in rows))]
    return "\n".join(lines)


def count(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def fmt(x):
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"


# ----------------------------------------------------------------------------- main

def main(argv=None):
    args = arg_parser().parse_args(argv)
    try:
        prompt = read_prompt(args.start)
        device, reason = pick_device(args.device)
        device_type = device.split(":")[0]
        if args.compile and not args.kv_cache:
            raise ValueError("--compile=true compiles the cached decoding; it needs --kv_cache=true")
        if args.static_cache and not args.kv_cache:
            raise ValueError("--static_cache=true is a kind of KV cache; it needs --kv_cache=true")
        check_compile(args.compile, device_type)
        with decode_autocast(device_type):
            (compare if args.compare else sample_one)(args, prompt, device, reason)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # the reader (e.g. `| head`) left: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(0)


if __name__ == "__main__":
    main()
