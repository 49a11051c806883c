"""Generate text from a trained model, or from several side by side.

    python sample.py --out_dir=out --start="ROMEO:" --max_new_tokens=500 --seed=1
    python sample.py --compare out-rope out-sinusoidal --seed=1 [--format=markdown]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from data.tokenizer import tokenizer_from_meta
from train import load_checkpoint, model_from_checkpoint, pick_device, pick_dtype


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def arg_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="run folder holding best.pt / ckpt.pt")
    p.add_argument("--compare", nargs="+", metavar="DIR", help="run folders to sample side by side")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best", help="best.pt or ckpt.pt")
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path; empty starts from the start token")
    p.add_argument("--num_samples", type=positive_int, default=1, help="samples per model")
    p.add_argument("--max_new_tokens", type=positive_int, default=500, help="tokens to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random")
    p.add_argument("--top_k", type=positive_int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling: smallest set with this mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=1337, help="same seed, same text")
    p.add_argument("--max_context", type=positive_int, default=None,
                   help="tokens attended to (default block_size; more lets rope/alibi/none extrapolate)")
    p.add_argument("--rope_scaling", default=None, help="RoPE scaling at sampling time: none, linear, ntk, dynamic, yarn, llama3")
    p.add_argument("--rope_scaling_factor", type=float, default=None,
                   help="its factor (default max_context / block_size)")
    p.add_argument("--kv_cache", choices=("true", "false"), default="true", help="reuse keys and values across steps")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--format", choices=("text", "markdown"), default="text", help="how --compare prints")
    return p


def check_args(a):
    if a.temperature < 0:
        raise ValueError(f"--temperature={a.temperature} must be >= 0 (0 is greedy)")
    if a.top_p is not None and not 0 < a.top_p <= 1:
        raise ValueError(f"--top_p={a.top_p} must lie in (0, 1]")


def read_prompt(start):
    if start.startswith("FILE:"):
        path = Path(start[5:])
        if not path.is_file():
            raise ValueError(f"prompt file {str(path)!r} does not exist")
        return path.read_text(encoding="utf-8")
    return start


def checkpoint_path(out_dir, which):
    out = Path(out_dir)
    best, latest = out / "best.pt", out / "ckpt.pt"
    if which == "best" and best.is_file():
        return best
    return latest


class Loaded:
    """A model ready to sample: weights, tokenizer and the prompt's token ids."""

    def __init__(self, out_dir, args, device):
        path = checkpoint_path(out_dir, args.checkpoint)
        self.ckpt = load_checkpoint(path, device)
        self.name, self.path = str(out_dir), path
        self.model = model_from_checkpoint(self.ckpt, device).eval()
        self.tok = tokenizer_from_meta(self.ckpt["tokenizer"])
        cfg = self.model.config
        self.max_context = self.model.max_context(args.max_context)
        if args.rope_scaling:
            if cfg.pos_emb != "rope":
                raise ValueError(f"--rope_scaling needs a RoPE model; {self.name} uses pos_emb={cfg.pos_emb}")
            factor = args.rope_scaling_factor or max(1.0, self.max_context / cfg.block_size)
            self.model.pos.set_rope_scaling(args.rope_scaling, factor, cfg.block_size)
        prompt = read_prompt(args.start)
        try:
            ids = self.tok.encode(prompt) if prompt else [self.ckpt["tokenizer"]["start_id"]]
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None
        self.ids = torch.tensor([ids], dtype=torch.long, device=device)

    @torch.no_grad()
    def prompt_loss(self):
        """Mean cross-entropy of the prompt under the model (how surprised it is), or None for < 2 tokens."""
        ids = self.ids[:, -self.max_context - 1:]
        if ids.shape[1] < 2:
            return None
        return self.model(ids[:, :-1], ids[:, 1:])[1].item()

    def stream(self, args, generator, write=None):
        """Generate one sample, writing text as it comes; returns (text, tokens per second)."""
        out, shown = [], ""
        t0 = time.perf_counter()
        for nxt in self.model.generate(self.ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                       args.max_context, use_cache=args.kv_cache == "true", generator=generator):
            out.append(nxt.item())
            text = self.tok.decode(out)
            if write and not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                write(text[len(shown):])
                shown = text
        rate = len(out) / (time.perf_counter() - t0)
        text = self.tok.decode(out)
        if write:
            write(text[len(shown):] + "\n")
        return text, rate


def generator_for(seed, device):
    return torch.Generator(device=device).manual_seed(seed)


def sample_one(args, device):
    m = Loaded(args.out_dir, args, device)
    g = generator_for(args.seed, device)
    for i in range(args.num_samples):
        if i:
            print("-" * 40)
        sys.stdout.write(read_prompt(args.start))
        m.stream(args, g, write=lambda s: (sys.stdout.write(s), sys.stdout.flush()))


def compare(args, device):
    rows = []
    for d in args.compare:
        m = Loaded(d, args, device)
        cfg = m.model.config
        texts, rates = zip(*(m.stream(args, generator_for(args.seed, device)) for _ in range(args.num_samples)))
        rows.append({"model": m.name, "pos_emb": cfg.pos_emb, "params": m.model.num_params(),
                     "best_val_loss": m.ckpt.get("best_val_loss"), "prompt_loss": m.prompt_loss(),
                     "tokens_per_s": sum(rates) / len(rates), "samples": texts})
    print(format_markdown(rows, args) if args.format == "markdown" else format_text(rows, args))


def fmt(x, spec=".4f"):
    return "n/a" if x is None or x == float("inf") else format(x, spec)


def format_text(rows, args):
    prompt = read_prompt(args.start)
    blocks = []
    for r in rows:
        head = (f"=== {r['model']}: pos_emb={r['pos_emb']}, {r['params'] / 1e6:.2f}M params, best val loss "
                f"{fmt(r['best_val_loss'])}, prompt loss {fmt(r['prompt_loss'])}, {r['tokens_per_s']:.0f} tokens/s")
        blocks.append(head + "\n" + "\n---\n".join(prompt + s for s in r["samples"]))
    return "\n\n".join(blocks)


def format_markdown(rows, args):
    def cell(text):
        return text.replace("|", "\\|").replace("\n", "<br>")
    lines = [f"Prompt: `{cell(read_prompt(args.start))}`, seed {args.seed}, temperature {args.temperature}\n",
             "| model | pos_emb | params | best val loss | prompt loss | tokens/s | sample |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        for s in r["samples"]:
            lines.append(f"| {r['model']} | {r['pos_emb']} | {r['params'] / 1e6:.2f}M | {fmt(r['best_val_loss'])} | "
                         f"{fmt(r['prompt_loss'])} | {r['tokens_per_s']:.0f} | {cell(s)} |")
    return "\n".join(lines)


def main(argv=None):
    args = arg_parser().parse_args(argv)
    try:
        check_args(args)
        device, _ = pick_device(args.device)
        with torch.autocast(device.split(":")[0], dtype=pick_dtype("auto", device.split(":")[0]),
                            enabled=device.startswith("cuda")):
            compare(args, device) if args.compare else sample_one(args, device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
