"""Context extension: fine-tune RoPE past its trained length (PI, NTK, YaRN) and probe retrieval at distance.

    python lab/extend.py configs/extend_cpu.toml [--key=value ...]

1. Base models: each scheme trained at L0 = block_size for each seed, passkey_share of the sequences carrying a
   passkey (data/passkey.py), exactly as lab/ablate.py trains (the same batches for every scheme of a seed).
2. Fine-tuning: each seed's RoPE model trained on at s*L0 for every s in `factors` and every scaling in `scalings`
   (`none`: direct fine-tuning at the new length; `linear`: position interpolation, PI; `ntk`; `yarn`), with
   factor s and the scaling saved in the run's config, so sample.py, evaluation and resume use it. Fine-tuning keeps
   the tokens per step (batch_size / s sequences), restarts the optimizer (train.py's init_from) and is scored
   after each of `finetune_steps` (0: the base model with the scaling alone) on the ablation's fixed validation
   windows at L0, s*L0 and 2s*L0.
3. The passkey probe: accuracy against window length (key at the start, question at the end) for every base model
   (RoPE also with each scaling, factor W/L0, before fine-tuning) and every fine-tuned model.

out_dir receives base/<scheme>-seed<S>/ and finetune/<scaling>-x<s>-seed<S>/ (one train.py run each, with its
eval.json), results.json, results.md and, with matplotlib, the plots. Rerunning the same command resumes.
Settings: ExtendConfig (here), GPTConfig and TrainConfig; `python lab/extend.py --help` lists them all.
"""

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, sys.path[0] is lab/
import config  # noqa: E402
import positions  # noqa: E402
import rope  # noqa: E402
import train  # noqa: E402
from checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from config import opt  # noqa: E402
from data.loader import Batches  # noqa: E402
from data.passkey import Passkeys  # noqa: E402
from data.tokenizer import load_meta, tokenizer_from_meta  # noqa: E402
from files import RunLock, atomic_write  # noqa: E402
from lab import extend_report  # noqa: E402
from lab.grid import (check_same_settings, command, eval_runtime, eval_sets, evaluated, numbers,  # noqa: E402
                      position_losses, split_list, train_run, train_settings, write_json)
from model import GPTConfig  # noqa: E402
from runtime import Runtime, run_record  # noqa: E402


@dataclass
class ExtendConfig:
    schemes: str = opt("rope,alibi,sinusoidal,learned,none", "schemes trained at L0 and probed (rope is fine-tuned)")
    seeds: int = opt(3, "seeds: seed, seed+1, ...")
    scalings: str = opt("none,linear,ntk,yarn", "RoPE scalings to fine-tune with (none: direct fine-tuning)")
    factors: str = opt("2", "extension factors s: fine-tune at s x block_size, comma-separated")
    finetune_steps: str = opt("0,25,50,100,200,400", "fine-tuning steps scored; the last is the run's length")
    finetune_lr: float = opt(5e-4, "peak learning rate of fine-tuning (cosine decay to a tenth of it)")
    finetune_warmup: int = opt(10, "fine-tuning's warmup steps")
    eval_tokens: int = opt(16384, "validation tokens per length in the loss curves, in fixed windows of that length")
    passkey_lengths: str = opt("0.5,1,2,4,8", "passkey probe windows as multiples of block_size")
    passkey_trials: int = opt(64, "passkey probe windows per length")

    def __post_init__(self):
        config.require_positive(self, "seeds", "eval_tokens", "passkey_trials")
        if not 0 < self.finetune_lr < math.inf or self.finetune_warmup < 0:
            raise ValueError(f"finetune_lr={self.finetune_lr} must be > 0 and finetune_warmup="
                             f"{self.finetune_warmup} >= 0")


@dataclass
class Lab:
    """Everything fixed for the whole lab, resolved and checked before anything trains."""
    ec: ExtendConfig
    gcfg: GPTConfig
    tc: train.TrainConfig
    schemes: list
    scalings: list
    factors: list
    steps: list
    seeds: list
    rt: Runtime
    passkeys: Passkeys
    probe: dict  # {W: Batches holding the probe's fixed windows of W tokens}
    windows: dict  # {L: Batches holding the fixed validation windows of L tokens}, L in s*L0 multiples

    @property
    def out(self):
        return Path(self.tc.out_dir)

    def base(self, scheme, seed):
        """(out, model config, train config) of a base run."""
        return (self.out / "base" / f"{scheme}-seed{seed}", replace(self.gcfg, pos_emb=scheme),
                replace(self.tc, seed=seed))

    def finetune(self, scaling, s, seed):
        """(out, model config, train config) of a fine-tuning run, its whole length."""
        L0 = self.gcfg.block_size
        gcfg = replace(self.gcfg, pos_emb="rope", block_size=round(s * L0), rope_scaling=scaling,
                       rope_scaling_factor=float(s) if scaling != "none" else 1.0, rope_original_len=L0)
        tc = replace(self.tc, seed=seed, init_from=str(self.base("rope", seed)[0]), learning_rate=self.ec.finetune_lr,
                     min_lr=self.ec.finetune_lr / 10, warmup_iters=self.ec.finetune_warmup, max_iters=self.steps[-1],
                     lr_decay_iters=self.steps[-1], eval_interval=self.steps[-1],
                     batch_size=max(1, round(self.tc.batch_size / s)))
        return self.out / "finetune" / f"{scaling}-x{s:g}-seed{seed}", gcfg, tc


def make_lab(ec, gcfg, tc):
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg, L0 = replace(gcfg, vocab_size=meta["vocab_size"]), gcfg.block_size
    schemes = split_list(ec.schemes)
    for s in schemes:
        if s not in positions.SCHEMES:
            raise ValueError(f"schemes: {s!r} is not a positional scheme; choose from {', '.join(positions.SCHEMES)}")
    if "rope" not in schemes:
        raise ValueError(f"schemes={ec.schemes!r} lacks rope, the scheme fine-tuning extends")
    scalings = split_list(ec.scalings)
    for s in scalings:
        if s not in rope.SCALINGS:
            raise ValueError(f"scalings: {s!r} is unknown; choose from {', '.join(rope.SCALINGS)}")
    factors = numbers("factors", ec.factors, float, 1.0, "2,4")
    steps = numbers("finetune_steps", ec.finetune_steps, int, 0, "0,25,50,100,200,400")
    if steps[0] != 0 or len(steps) < 2:
        raise ValueError(f"finetune_steps={ec.finetune_steps!r} must start at 0 (the base model) and go on")
    rt = eval_runtime(tc)
    device = rt.device
    per_forward = tc.batch_size * L0
    lengths = sorted({L0} | {round(m * L0) for s in factors for m in (s, 2 * s)})
    windows = eval_sets(dataset_dir, meta, lengths, ec.eval_tokens, per_forward, device)
    probe = {}
    for m in numbers("passkey_lengths", ec.passkey_lengths, float, 0, "0.5,1,2,4,8"):
        W, rows = round(m * L0), max(1, per_forward // round(m * L0))
        probe[W] = Batches(dataset_dir, meta, W, rows, 0, device, eval_iters=math.ceil(ec.passkey_trials / rows))
    lab = Lab(ec, gcfg, tc, schemes, scalings, factors, steps, [tc.seed + i for i in range(ec.seeds)], rt,
              Passkeys(tokenizer_from_meta(meta)), probe, windows)
    for scaling in scalings:  # a bad setting fails now, not after the base models trained
        lab.finetune(scaling, factors[0], tc.seed)
    return lab


# ----------------------------------------------------------------------------- evaluation

def load_model(out, rt, **changes):
    model = model_from_checkpoint(load_checkpoint(out / "ckpt.pt", rt.device), rt.device).eval()
    return model.reconfigure(**changes) if changes else model


def losses(model, lab, lengths):
    """{L: mean val loss over the fixed windows of L tokens}."""
    return {str(L): position_losses(model, lab.windows[L], lab.rt).mean().item() for L in lengths}


def passkey(lab, out, scaling="none"):
    """{W: passkey accuracy} of the run in out, as trained; with a scaling, by factor W/L0 past L0 (else None)."""
    model = load_model(out, lab.rt)
    L0, scheme, acc = model.config.block_size, positions.scheme(model.config.pos_emb), {}
    for W, batches in lab.probe.items():
        if scaling != "none" and W <= L0:
            continue
        if W > L0 and not scheme.extrapolates:
            acc[str(W)] = None
            continue
        if scaling != "none":
            model.reconfigure(rope_scaling=scaling, rope_scaling_factor=W / L0)
        acc[str(W)] = lab.passkeys.accuracy(model, batches, lab.rt)
    return acc


# ----------------------------------------------------------------------------- runs

def check_settings(out, gcfg, tc):
    """A run folder made with other settings is refused (max_iters aside: fine-tuning grows it stage by stage)."""
    if (out / "config.json").is_file():
        saved = json.loads((out / "config.json").read_text())
        saved["train"]["max_iters"] = tc.max_iters
        check_same_settings(out, train_settings(gcfg, tc), saved)


def base_run(lab, scheme, seed):
    out, gcfg, tc = lab.base(scheme, seed)
    check_settings(out, gcfg, tc)
    summary = evaluated(out / "summary.json", lambda: train_run(scheme, gcfg, tc, out))
    scalings = ["none"] + [sc for sc in lab.scalings if sc != "none" and sc in positions.scheme(scheme).scalings]
    probe = evaluated(out / "eval.json", lambda: {"passkey": {sc: passkey(lab, out, sc) for sc in scalings}})
    return {"final_val_loss": summary["final_val_loss"], **probe}


def finetune_run(lab, scaling, s, seed):
    """Fine-tune in stages up to each scored step (a resume is exact, so the stages add up to one run), scoring
    the loss at L0, s*L0 and 2s*L0 after each; then the passkey probe."""
    out, gcfg, tc = lab.finetune(scaling, s, seed)
    check_settings(out, gcfg, tc)
    L0 = lab.gcfg.block_size
    lengths = [L0, round(s * L0), round(2 * s * L0)]
    base_out = lab.base("rope", seed)[0]
    curve = {}
    for step in lab.steps:
        if step == 0:  # the base model with the scaling alone
            changes = {"rope_scaling": scaling, "rope_scaling_factor": gcfg.rope_scaling_factor}
            curve["0"] = evaluated(out / "step0.json", lambda: losses(load_model(base_out, lab.rt, **changes), lab,
                                                                       lengths))
            continue
        train_run(f"{scaling}-x{s:g}", gcfg, replace(tc, max_iters=step), out)
        curve[str(step)] = evaluated(out / f"step{step}.json", lambda: losses(load_model(out, lab.rt), lab, lengths))
    return {"loss": curve, **evaluated(out / "eval.json", lambda: {"passkey": passkey(lab, out)})}


def run_lab(lab):
    t0 = time.perf_counter()
    jobs = [("base", scheme, None, seed) for seed in lab.seeds for scheme in lab.schemes]
    jobs += [("finetune", sc, s, seed) for seed in lab.seeds for s in lab.factors for sc in lab.scalings]
    with RunLock(lab.out, "context-extension lab"):
        done = {}
        with tqdm(jobs, desc="extend", unit="run", dynamic_ncols=True, disable=not lab.tc.progress) as bar:
            for kind, name, s, seed in bar:
                bar.set_postfix_str(f"{kind} {name}{'' if s is None else f' x{s:g}'} seed {seed}")
                done[kind, name, s, seed] = (base_run(lab, name, seed) if kind == "base"
                                             else finetune_run(lab, name, s, seed))
        results = {"block_size": lab.gcfg.block_size, "seeds": lab.seeds, "steps": lab.steps,
                   "factors": lab.factors, "scalings": lab.scalings, "schemes": lab.schemes,
                   "probe_windows": {W: len(b.eval_starts["val"]) for W, b in lab.probe.items()},
                   "settings": {"extend": asdict(lab.ec), **train_settings(lab.gcfg, lab.tc)},
                   "device": lab.rt.device, "environment": run_record(),
                   **extend_report.lab_figures(lab, done)}
        plots = extend_report.write_plots(results, lab.out)
        results["wall_s"] = time.perf_counter() - t0
        write_json(lab.out / "results.json", results)
        atomic_write(lab.out / "results.md", lambda f: f.write(extend_report.markdown(results, plots).encode()))
    print(f"results: {lab.out / 'results.md'}, results.json" + "".join(f", {f}" for f, _ in plots.written))


def main(argv=None):
    command(argv, __doc__, ExtendConfig, lambda *settings: run_lab(make_lab(*settings)))

if __name__ == "__main__":
    main()
