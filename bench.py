"""Throughput benchmarks: the training step, generation, the RoPE rotation, the matmul peak and the lab's probe.

    python bench.py                                  a table; nanoGPT's CPU recipe shape
    python bench.py --json                           one JSON object a line
    python bench.py --config configs/X.toml --only train_step,generate --repeats 30
    python bench.py --quick                          seconds: a tiny model, few repeats, no compile (CI)
    python bench.py --only to_loss --nanogpt DIR     whole training commands against nanoGPT's (minutes)
    python bench.py --only train_step,probe --threads 1 --dtype float32 --probe_lengths 1,2,4 --probe_trials 1
                                                     the lab's work per core: its steps, its probe (a prepared dataset)

Every figure is a median over repeats after warm-up, with its spread. The variants of a bench
are timed in turn within each repeat, so load from other processes falls on all of them alike
and their ratios stay fair on a shared machine.
"""

import copy
import functools
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

import config
import rope
from config import POSITIVE, opt
from data.loader import Batch
from data.tokenizer import load_meta
from files import read_log
from generate import Sampling, generate
from lab.retrieval import Probe, ProbeWindows
from model import GPT, GPTConfig
from optim import make_optimizer
from runtime import check_compile, decode_autocast, setup_runtime
from train import TrainConfig, train_step

REPEATS = {"matmul_peak": 10, "train_step": 20, "generate": 5, "rope_apply": 20, "to_loss": 3, "probe": 3}
# nanoGPT README's CPU recipe shape (4 layers, 4 heads, 128 wide, context 64, batch 12, no dropout; vocab 65
# is GPTConfig's default, tiny Shakespeare's characters): the shape nanorope's CPU throughput is compared at
ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "shakespeare_char_cpu.toml"
QUICK = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0, vocab_size=65), dict(batch_size=4)
ROPE_SHAPE, ROPE_SHAPE_QUICK = (8, 6, 256, 64), (2, 2, 32, 16)  # (B, H, T, d): six 64-wide heads at context 256


@dataclass
class BenchConfig:
    json: bool = opt(False, "print one JSON object a line instead of a table")
    device: str | None = opt(None, "auto, cpu, cuda, cuda:N or mps (default: the config's, auto)")
    dtype: str | None = opt(None, "auto, float32, bfloat16 or float16 (default: the config's)")
    config: str | None = opt(
        None,
        "a run config (TOML) giving the model and batch shape (default: "
        "configs/shakespeare_char_cpu.toml, nanoGPT's CPU recipe shape; quick: a tiny model)",
    )
    only: str = opt(
        "",
        "benches to run, comma-separated: matmul_peak, train_step, generate, rope_apply, to_loss, "
        "probe (default: all but to_loss, which takes minutes and needs nanoGPT, and probe, which "
        "needs the config's dataset prepared)",
    )
    quick: bool = opt(False, "a tiny model, few repeats and no torch.compile: seconds, for CI")
    repeats: int | None = opt(None, "timed repeats per variant (default per bench)", check=POSITIVE)
    threads: int | None = opt(
        None,
        "CPU threads for torch (default: torch's choice; 1 with quick, which on a busy "
        "machine is faster than threads waiting on each other)",
        check=POSITIVE,
    )
    new_tokens: int | None = opt(None, "tokens per generation (default 500; 16 quick)", check=POSITIVE)
    nanogpt: str | None = opt(
        None, "to_loss: a nanoGPT checkout (github.com/karpathy/nanoGPT) with data/shakespeare_char prepared"
    )

    def __post_init__(self):
        config.validate(self)


# ----------------------------------------------------------------------------- timing


def time_in_turns(fns, repeats, warmup=1, number=1, sync=lambda: None, desc=None):
    """Seconds per call of each fn {name: fn}: `warmup` untimed rounds, then `repeats` rounds that
    each time every fn in turn over `number` back-to-back calls."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync()
    seconds = {name: [] for name in fns}
    for _ in tqdm(range(repeats), desc=desc, leave=False, disable=None):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            seconds[name].append((time.perf_counter() - t0) / number)
    return seconds


def spread(seconds):
    """Median, min and max in milliseconds, and the number of repeats."""
    ms = [s * 1e3 for s in seconds]
    return {"ms_median": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms), "repeats": len(ms)}


def timed_first_call(fn, sync):
    """Seconds taken by one call: for a compiled function, the compilation (plus one run)."""
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- benches


def square_matmul(run):
    """n and a call of an (n, n) @ (n, n) matmul in the training dtype: big enough to reach the device's peak."""
    n = 128 if run.quick else 4096 if run.runtime.device_type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=run.runtime.device, dtype=run.runtime.dtype) for _ in range(2))
    return n, lambda: a @ b


def gflops(n, seconds):
    return 2 * n**3 / seconds / 1e9


def bench_matmul_peak(run):
    """The matmul rate: what MFU divides by."""
    n, matmul = square_matmul(run)
    seconds = time_in_turns(
        {"mm": matmul}, run.repeats("matmul_peak"), number=5 if run.quick else 3, sync=run.sync, desc="matmul_peak"
    )["mm"]
    figures = spread(seconds)
    figures["gflops"] = gflops(n, statistics.median(seconds))
    return [({"n": n, "dtype": run.dtype_name, "threads": torch.get_num_threads()}, figures)]


def make_train_step(model, train_cfg, runtime):
    """train.py's optimizer step over the given forward (the model or its compiled form) and micro-batches
    [(x, y), ...], its loss read back as train.py reads it every step. The learning rate stays at its peak:
    its value does not change the step's time."""
    optimizer, scaler = make_optimizer(model, train_cfg, runtime)

    def step(forward, batches):
        micro_batches = [Batch(x, y) for x, y in batches]
        train_step(forward, optimizer, scaler, micro_batches, train_cfg.learning_rate, train_cfg.grad_clip, runtime)[
            0
        ].item()

    return step


def bench_train_step(run):
    model_cfg, train_cfg, runtime = run.model_cfg, run.train_cfg, run.runtime
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg).to(runtime.device)
    step = make_train_step(model, train_cfg, runtime)
    micro = train_cfg.gradient_accumulation_steps
    # a few fixed random batches, cycled: the step's cost does not depend on which tokens it sees
    data = torch.randint(
        model_cfg.vocab_size, (4, micro, train_cfg.batch_size, model_cfg.block_size + 1), device=runtime.device
    )
    batches = [[(seq[:, :-1], seq[:, 1:]) for seq in group] for group in data]  # x, y (B, T) each
    turns = itertools.cycle(batches)

    def with_batches(forward):
        return lambda: step(forward, next(turns))

    # MFU's peak is timed in the same rounds as the steps: on a shared machine a peak measured apart, under
    # other load, can come out below what the steps reach
    n, matmul = square_matmul(run)
    variants = {"matmul": matmul, False: with_batches(model)}
    # the same step with queries and keys left unturned (a copy, so both start alike): the rotation's share of a step
    unturned = copy.deepcopy(model)
    unturned.scheme.rotate = lambda qk, span, layer: qk
    variants["unturned"] = functools.partial(make_train_step(unturned, train_cfg, runtime), unturned, next(turns))
    compile_s = None
    if run.compile:
        variants[True] = with_batches(torch.compile(model))
        compile_s = timed_first_call(variants[True], run.sync)
    seconds = time_in_turns(variants, run.repeats("train_step"), warmup=2, sync=run.sync, desc="train_step")
    peak_gflops = gflops(n, statistics.median(seconds.pop("matmul")))
    unturned_s = statistics.median(seconds.pop("unturned"))
    tokens_per_step = micro * train_cfg.batch_size * model_cfg.block_size
    flops_per_token = model.flops_per_token(model_cfg.block_size)
    rows = []
    for compiled, s in seconds.items():
        figures = spread(s)
        figures["tokens_per_s"] = tokens_per_step / (figures["ms_median"] / 1e3)
        figures["peak_gflops"] = peak_gflops
        figures["mfu"] = flops_per_token * figures["tokens_per_s"] / (peak_gflops * 1e9)
        if compiled:
            figures["compile_s"] = compile_s
        else:  # what the scheme's rotate() costs in an eager step: RoPE's path, 0 for a scheme that turns nothing
            figures["rotation_share"] = 1 - unturned_s * 1e3 / figures["ms_median"]
        rows.append(({"compiled": compiled, **run.shape(batch=True)}, figures))
    return rows


def bench_generate(run):
    """Greedy decoding from a 1-token prompt, batch 1: with the KV cache (dynamic, and static: fixed shapes, a CUDA
    graph when compiled on CUDA), eager and compiled, and without it; speedup is each variant's tokens/s over the
    uncached one's."""
    torch.manual_seed(run.train_cfg.seed)
    model = GPT(run.model_cfg).to(run.runtime.device).eval()
    prompt = torch.zeros((1, 1), dtype=torch.long, device=run.runtime.device)

    def generation(use_cache, compile=False, static_cache=False):
        cache = "static" if static_cache else "dynamic" if use_cache else "none"

        def call():
            with decode_autocast(run.runtime.device_type, run.runtime.dtype):  # as sample.py decodes
                for _ in generate(model, prompt, run.new_tokens, Sampling(temperature=0), cache, compile):
                    pass

        return call

    # (kv_cache, compiled, static_cache)
    variants = {
        (True, False, False): generation(True),
        (True, False, True): generation(True, static_cache=True),
        (False, False, False): generation(False),
    }
    compile_s = {}
    if run.compile:
        for static in (False, True):
            variants[True, True, static] = generation(True, compile=True, static_cache=static)
            compile_s[static] = timed_first_call(variants[True, True, static], run.sync)
    seconds = time_in_turns(variants, run.repeats("generate"), sync=run.sync, desc="generate")
    uncached_ms = statistics.median(seconds[False, False, False]) * 1e3
    rows = []
    for (kv_cache, compiled, static), s in seconds.items():
        figures = spread(s)
        figures["tokens_per_s"] = run.new_tokens / (figures["ms_median"] / 1e3)
        if kv_cache:
            figures["speedup"] = uncached_ms / figures["ms_median"]
        if compiled:
            figures["compile_s"] = compile_s[static]
        variant = {
            "kv_cache": kv_cache,
            "static_cache": static,
            "compiled": compiled,
            "new_tokens": run.new_tokens,
            **run.shape(batch=False),
        }
        rows.append((variant, figures))
    return rows


def rotate_half_reference(x, cos, sin):
    """Half layout as GPT-NeoX / HF Llama write it: x * cos + rotate_half(x) * sin on full-width tables."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., T, d/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def complex_reference(x, freqs_cis):
    """Interleaved layout as Meta's Llama writes it: pairs as complex numbers times e^{i m theta}."""
    xc = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # (..., T, d/2, 2) -> (..., T, d/2) complex
    return torch.view_as_real(xc * freqs_cis).flatten(-2)  # (..., T, d/2, 2) -> (..., T, d)


def rope_impls(cos, sin):
    """name -> (layout it computes or None, forward fn of x); the references' tables built once, outside timing."""
    cos2, sin2 = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # (T, d)
    freqs_cis = torch.complex(cos, sin)  # (T, d/2): e^{i m theta}
    return {
        "apply_rope/interleaved": ("interleaved", lambda x: rope.apply_rope(x, cos, sin, "interleaved")),
        "apply_rope/half": ("half", lambda x: rope.apply_rope(x, cos, sin, "half")),
        # rope.py's pair formula itself, which apply_rope runs compiled; eager, the complex product replaces it
        "rotate_pairs/interleaved": ("interleaved", lambda x: rope.rotate_pairs(x, cos, sin, "interleaved")),
        "complex": ("interleaved", lambda x: complex_reference(x, freqs_cis)),
        "rotate_half": ("half", lambda x: rotate_half_reference(x, cos2, sin2)),
        "clone": (None, lambda x: x.clone()),
    }


def bench_rope_apply(run):
    """Forward + backward of the rotation, float32, against two reference formulations and clone()."""
    shape = ROPE_SHAPE_QUICK if run.quick else ROPE_SHAPE
    T, d = shape[2:]
    device = run.runtime.device
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(device).requires_grad_()
    grad = torch.randn(shape, generator=g).to(device)
    cos, sin = rope.tables(rope.frequencies(d).to(device), torch.arange(T, device=device))  # (T, d/2)
    impls = rope_impls(cos, sin)
    with torch.no_grad():
        for name, (layout, fn) in impls.items():
            want = x if layout is None else rope.apply_rope(x, cos, sin, layout)
            torch.testing.assert_close(
                fn(x), want, msg=lambda m, name=name: f"rope_apply: {name} disagrees with apply_rope: {m}"
            )

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(x), x, grad)

    variants = {(name, False): fwd_bwd(fn) for name, (_, fn) in impls.items()}
    compile_s = {}
    if run.compile:
        for name, (_, fn) in impls.items():
            variants[name, True] = fwd_bwd(torch.compile(fn))
            compile_s[name] = timed_first_call(variants[name, True], run.sync)
    seconds = time_in_turns(variants, run.repeats("rope_apply"), warmup=2, number=5, sync=run.sync, desc="rope_apply")
    medians = {key: statistics.median(s) for key, s in seconds.items()}
    rows = []
    for (name, compiled), s in seconds.items():
        figures = spread(s)
        figures["vs_clone"] = medians[name, compiled] / medians["clone", compiled]
        if name.startswith("apply_rope"):
            figures["vs_best_reference"] = medians[name, compiled] / min(
                medians["complex", compiled], medians["rotate_half", compiled]
            )
        if compiled:
            figures["compile_s"] = compile_s[name]
        impl, _, layout = name.partition("/")
        variant = {
            "impl": impl,
            "layout": layout or impls[name][0],
            "compiled": compiled,
            "shape": "x".join(map(str, shape)),
            "dtype": "float32",
        }
        rows.append((variant, figures))
    return rows


def bench_probe(run):
    """The lab's scoring (lab/retrieval.py) of a model of the config's shape, untrained (the time does not depend on
    the weights): the recall probe's distance windows at each probed length (Probe.hits), each context read once
    for all its queries ("forked", as the lab scores them) and each query's window read whole ("whole", one forward
    per answer: the layout's cost before contexts were read once), and the slot probe at L0 (by_slot), as the lab
    runs them (its tokens per forward, its device and dtype), eager and compiled. answers_per_s: scored answers
    (whole answers of a query) per second."""
    meta = load_meta(Path(run.train_cfg.data_dir) / run.train_cfg.dataset)
    model_cfg = replace(run.model_cfg, vocab_size=meta["vocab_size"])
    L0 = model_cfg.block_size
    probe = Probe(
        meta, L0, run.probe_windows, run.probe_windows.probe_pairs, run.train_cfg.batch_size * L0, run.runtime.device
    )
    torch.manual_seed(run.train_cfg.seed)
    model = GPT(model_cfg).to(run.runtime.device).eval()

    def scoring(forward, what, W, read):
        if what == "slot":
            return lambda: probe.by_slot(forward, W, run.runtime)
        return lambda: probe.hits(forward, W, run.runtime, whole=read == "whole")

    work = [("distance", W, read) for W in probe.lengths for read in ("whole", "forked")] + [("slot", L0, "whole")]
    variants = {(*job, False): scoring(model, *job) for job in work}
    compile_s = {}
    if run.compile:
        compiled = torch.compile(model)
        for job in work:  # in turn: a new window length may compile anew (dynamic shapes), the slot probe not
            variants[*job, True] = scoring(compiled, *job)
            compile_s[job] = timed_first_call(variants[*job, True], run.sync)
    seconds = time_in_turns(variants, run.repeats("probe"), sync=run.sync, desc="probe")
    rows = []
    for (what, W, read, compiled), s in seconds.items():
        # a query answered at the end of a window of W tokens: each distance query, or each slot window's pairs
        windows = len(probe.slots[W]) if what == "slot" else int((probe.windows[W][2] >= 0).sum())
        answers = windows * (probe.recall.pairs if what == "slot" else 1)
        figures = spread(s)
        figures["windows_per_s"] = windows / (figures["ms_median"] / 1e3)
        figures["tokens_per_s"] = figures["windows_per_s"] * W
        figures["answers_per_s"] = answers / (figures["ms_median"] / 1e3)
        if compiled:
            figures["compile_s"] = compile_s[what, W, read]
        variant = {
            "probe": what,
            "window": W,
            "read": read,
            "windows": windows,
            "compiled": compiled,
            "threads": torch.get_num_threads(),
            **run.shape(batch=False),
        }
        rows.append((variant, figures))
    return rows


# nanoGPT README's CPU command for tiny Shakespeare (float32 on a CPU: nanoGPT autocasts on CUDA only)
NANOGPT_CPU = [
    "train.py",
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]
NANOGPT_VAL = re.compile(r"step \d+: train loss [\d.]+, val loss ([\d.]+)")


def bench_to_loss(run):
    """Whole training commands, timed in turns from start to exit: `python train.py` on the config (the
    quickstart's by default) in float32 and in the config's own dtype, against nanoGPT's CPU command in the
    --nanogpt checkout. Each starts in a fresh out_dir; its last val loss is reported beside its time, and
    vs_nanogpt is nanoGPT's median time over the command's."""
    if not run.nanogpt or not (Path(run.nanogpt) / "data/shakespeare_char/train.bin").is_file():
        raise ValueError(
            f"--only=to_loss needs --nanogpt DIR, a nanoGPT checkout whose data/shakespeare_char is "
            f"prepared (python data/shakespeare_char/prepare.py there); got {run.nanogpt!r}"
        )
    ours = ["train.py", run.config_path, "--progress=false"]
    commands = {
        "nanogpt": (run.nanogpt, NANOGPT_CPU),
        "float32": (ROOT, [*ours, "--dtype=float32"]),
        run.dtype_name: (ROOT, [*ours, f"--dtype={run.train_cfg.dtype}"]),
    }  # what the config's dtype runs as here
    val = {}
    with tempfile.TemporaryDirectory() as tmp:

        def whole(name, cwd, args):
            def call():
                out = Path(tempfile.mkdtemp(dir=tmp))
                proc = subprocess.run(
                    [sys.executable, *args, f"--out_dir={out}"],
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    env=os.environ | {"OMP_NUM_THREADS": str(torch.get_num_threads())},
                )
                if proc.returncode:
                    raise ValueError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
                val[name] = (
                    float(NANOGPT_VAL.findall(proc.stdout)[-1])
                    if name == "nanogpt"
                    else [m for m in read_log(out / "metrics.jsonl") if "val_loss" in m][-1]["val_loss"]
                )

            return call

        seconds = time_in_turns(
            {name: whole(name, *c) for name, c in commands.items()}, run.repeats("to_loss"), warmup=0, desc="to_loss"
        )
    nanogpt_s = statistics.median(seconds["nanogpt"])
    return [
        (
            {"command": name if name == "nanogpt" else f"nanorope {name}"},
            spread(s) | {"val_loss": val[name], "vs_nanogpt": nanogpt_s / statistics.median(s)},
        )
        for name, s in seconds.items()
    ]


BENCHES = {
    "matmul_peak": bench_matmul_peak,
    "train_step": bench_train_step,
    "generate": bench_generate,
    "rope_apply": bench_rope_apply,
    "to_loss": bench_to_loss,
    "probe": bench_probe,
}
# to_loss: minutes of whole runs, and needs nanoGPT; probe: needs the config's dataset prepared
DEFAULT_BENCHES = [name for name in BENCHES if name not in ("to_loss", "probe")]


# ----------------------------------------------------------------------------- the run


class Run:
    """What every bench needs: the model and training config, the runtime, and the run's options (args, a BenchConfig;
    probe_windows, the probe bench's ProbeWindows)."""

    def __init__(self, args, probe_windows):
        self.quick = args.quick
        if args.quick and not args.config:
            self.model_cfg, self.train_cfg = GPTConfig(**QUICK[0]), TrainConfig(**QUICK[1])
            self.config_name = "tiny"
        else:
            path = args.config or DEFAULT_CONFIG
            self.model_cfg, self.train_cfg = config.parse([str(path)], GPTConfig, TrainConfig)
            self.config_name = args.config or str(DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parent.parent))
        self.config_path = str(Path(args.config or DEFAULT_CONFIG).resolve())
        self.nanogpt = args.nanogpt
        self.train_cfg = replace(
            self.train_cfg, device=args.device or self.train_cfg.device, dtype=args.dtype or self.train_cfg.dtype
        )
        self.probe_windows = probe_windows
        if args.threads or args.quick:
            torch.set_num_threads(args.threads or 1)
        # the benches time eager and compiled side by side (see compile_note); the header reports the runtime
        self.runtime = setup_runtime(self.train_cfg.device, self.train_cfg.dtype, compile=False, quiet=True)
        self.dtype_name = self.runtime.dtype_name
        self.compile, self.compile_note = False, "off with --quick"
        if not args.quick:
            try:
                self.compile, self.compile_note = check_compile(True, self.runtime.device_type), "on"
            except ValueError as e:
                self.compile_note = f"skipped: {e}"
        self.new_tokens = args.new_tokens or (16 if args.quick else 500)
        self._repeats = args.repeats or (3 if args.quick else None)

    def repeats(self, bench):
        return self._repeats or REPEATS[bench]

    def sync(self):
        if self.runtime.device_type == "cuda":
            torch.cuda.synchronize(self.runtime.device)

    def shape(self, batch):
        """The variant fields naming the model (and batch) measured."""
        c = self.model_cfg
        out = {
            "config": self.config_name,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_embd": c.n_embd,
            "block_size": c.block_size,
            "vocab_size": c.vocab_size,
            "pos_emb": c.pos_emb,
            "dtype": self.dtype_name,
        }
        if batch:
            out["batch_size"] = self.train_cfg.batch_size * self.train_cfg.gradient_accumulation_steps
        return out


def parse_only(text):
    names = [n.strip() for n in text.split(",") if n.strip()] or DEFAULT_BENCHES
    bad = [n for n in names if n not in BENCHES]
    if bad:
        raise ValueError(f"only={text!r}: unknown bench {', '.join(bad)}; choose from {', '.join(BENCHES)}")
    return names


# ----------------------------------------------------------------------------- output

FIGURE_FORMATS = {
    "windows_per_s": "{:,.0f} windows/s",
    "tokens_per_s": "{:,.0f} tok/s",
    "answers_per_s": "{:,.1f} answers/s",
    "gflops": "{:.1f} GFLOP/s",
    "mfu": "MFU {:.1%}",
    "peak_gflops": "peak {:.1f} GFLOP/s",
    "speedup": "{:.2f}x uncached",
    "vs_clone": "{:.2f}x clone",
    "vs_best_reference": "{:.2f}x best ref",
    "compile_s": "compile {:.1f} s",
    "val_loss": "val {:.4f}",
    "vs_nanogpt": "{:.2f}x nanoGPT",
}
SHOWN_ONCE = (
    "config",
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "vocab_size",
    "pos_emb",
    "dtype",
    "batch_size",
    "shape",
    "threads",
)


def table_row(bench, variant, figures):
    what = " ".join(f"{k}={v}" for k, v in variant.items() if k not in SHOWN_ONCE and v is not None)
    ms = f"{figures['ms_median']:10.3f}  ({figures['ms_min']:.3f}-{figures['ms_max']:.3f}, n={figures['repeats']})"
    extra = ", ".join(fmt.format(figures[k]) for k, fmt in FIGURE_FORMATS.items() if k in figures)
    return f"{bench:<12} {what:<52} {ms:<40} {extra}"


def table_header(run, only):
    c = run.model_cfg
    lines = [
        f"device {run.runtime.device}, {run.dtype_name}, {torch.get_num_threads()} thread(s), "
        f"torch {torch.__version__}; "
        f"compiled variants {run.compile_note}",
        f"config {run.config_name}: n_layer={c.n_layer} n_head={c.n_head} n_embd={c.n_embd} "
        f"block_size={c.block_size} batch_size={run.train_cfg.batch_size} vocab_size={c.vocab_size} "
        f"pos_emb={c.pos_emb}",
    ]
    if "rope_apply" in only:
        lines.append(
            f"rope_apply: forward + backward, float32, (B, H, T, d) = {ROPE_SHAPE_QUICK if run.quick else ROPE_SHAPE}"
        )
    lines.append(f"{'bench':<12} {'variant':<52} {'ms median (min-max, repeats)':<40} figures")
    return "\n".join(lines)


def bench(args, probe_windows):
    only = parse_only(args.only)
    run = Run(args, probe_windows)
    if not args.json:
        print(table_header(run, only), flush=True)
    for name in BENCHES:
        if name not in only:
            continue
        for variant, figures in BENCHES[name](run):
            line = (
                json.dumps({"bench": name, "device": run.runtime.device, **variant, **figures})
                if args.json
                else table_row(name, variant, figures)
            )
            print(line, flush=True)


def main(argv=None):
    config.main(argv, __doc__, (BenchConfig, ProbeWindows), bench)  # the probe's windows declared where the lab's are


if __name__ == "__main__":
    main()
