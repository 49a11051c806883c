"""Context extension: fine-tune RoPE past its trained length (PI, NTK, YaRN) and ask the papers' questions of loss
and of retrieval at distance, over seeds, with the verdicts their tests allow.

    python lab/extend.py configs/extend_cpu.toml [--key=value ...]

1. Base models: each scheme trained at L0 = block_size for each seed (RoPE at each of `rope_bases`), recall_share
   of the sequences carrying the associative-recall task (data/recall.py), every scheme of a seed on the same
   batches. RoPE's base models are trained in stages and probed after each: the learning curve of retrieval.
2. Fine-tuning: each seed's RoPE model trained on at s*L0 for every s in `factors` and every scaling in `scalings`
   (`none`: direct fine-tuning at the new length; `linear`: position interpolation, PI; `ntk`; `yarn`) on the
   same mixture, with factor s and the scaling saved in the run's config (sample.py, evaluation and resume use
   it). Fine-tuning keeps the tokens per step (batch_size / s sequences), restarts the optimizer (train.py's
   init_from) and is scored after each of `finetune_steps` (0: the base model with the scaling alone): loss on
   the fixed validation windows at L0, s*L0 and 2s*L0, and retrieval over the depth x length grid.
3. Retrieval: one needle at each of `probe_depths` of fixed validation windows of each of `probe_lengths` x L0,
   its query at the window's end; the effective context window is the longest probed length up to which every
   length retrieves at least `retrieval_threshold` of the whole answers (the PI paper's Table 4 question).
4. Claims: the papers' claims as paired tests over seeds (lab/stats.py): a verdict per claim, Holm-corrected over
   the table; more seeds (`more_seeds`) for the runs of a claim whose p lies between 0.01 and 0.1.

out_dir receives base/<model>-seed<S>/ and finetune/<base>-<scaling>-x<s>-seed<S>/ (one train.py run each, with
its evaluations), results.json, results.md and, with matplotlib, the plots. Rerunning the same command resumes.
`workers` > 1 trains that many runs at a time, each in a process of its own (a fine-tune once its base is done).
Settings: ExtendConfig (here), GPTConfig and TrainConfig; `python lab/extend.py --help` lists them all.
"""

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, sys.path[0] is lab/
import config  # noqa: E402
import positions  # noqa: E402
import rope  # noqa: E402
import train  # noqa: E402
from checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from config import opt  # noqa: E402
from data.tokenizer import load_meta  # noqa: E402
from files import RunLock, atomic_write  # noqa: E402
from lab import extend_report  # noqa: E402
from lab.grid import (check_same_settings, command, eval_runtime, eval_sets, evaluated, numbers,  # noqa: E402
                      position_losses, run_jobs, split_list, train_run, train_settings, write_json)
from lab.retrieval import Probe, ProbeSettings  # noqa: E402
from data.batches import BatchConfig  # noqa: E402
from model import GPTConfig  # noqa: E402
from runtime import Runtime, run_record  # noqa: E402


@dataclass
class ExtendConfig(ProbeSettings):
    schemes: str = opt("rope,alibi,sinusoidal,learned,none", "schemes trained at L0 and probed (rope is fine-tuned)")
    rope_bases: str = opt("200,10000", "RoPE's bases: base models and fine-tunes for each (200 puts L0 = 64 at "
                                       "LLaMA-2's longest-wavelength-to-context ratio with head size 32)")
    seeds: int = opt(3, "RoPE's seeds: seed, seed+1, ... (its fine-tunes are what the claims compare)", check=config.POSITIVE)
    scheme_seeds: int = opt(3, "seeds of the other schemes' base models, which are probed but not tested", check=config.POSITIVE)
    more_seeds: int = opt(2, "seeds added to the runs of a claim whose p lies between 0.01 and 0.1")
    scalings: str = opt("none,linear,ntk,yarn", "RoPE scalings to fine-tune with (none: direct fine-tuning)")
    factors: str = opt("2,4", "extension factors s: fine-tune at s x block_size, comma-separated")
    base_stages: str = opt("250,500,1000", "steps of the RoPE base models' training at which retrieval is probed "
                                           "(the learning curve); the last is max_iters")
    finetune_steps: str = opt("0,50,100,200", "fine-tuning steps scored; the last is the run's length")
    finetune_lr: float = opt(5e-4, "peak learning rate of fine-tuning (cosine decay to a tenth of it); Muon's, where "
                                    "it trains, scaled alike from its pre-training peak")
    finetune_warmup: int = opt(10, "fine-tuning's warmup steps")
    eval_tokens: int = opt(16384, "validation tokens per length in the loss curves, in fixed windows of that length", check=config.POSITIVE)
    workers: int = opt(1, "runs trained at a time, each in a process with an equal share of the CPU threads (2 on 2 "
                          "CPU cores, which one small model's run leaves partly idle; 1 on a GPU)", check=config.POSITIVE)

    def __post_init__(self):
        super().__post_init__()
        config.validate(self)
        if not 0 < self.finetune_lr < math.inf or self.finetune_warmup < 0 or self.more_seeds < 0:
            raise ValueError(f"finetune_lr={self.finetune_lr} must be > 0, finetune_warmup={self.finetune_warmup} "
                             f">= 0 and more_seeds={self.more_seeds} >= 0")


@dataclass
class Lab:
    """Everything fixed for the whole lab, resolved and checked before anything trains."""
    ec: ExtendConfig
    gcfg: GPTConfig
    tc: train.TrainConfig
    schemes: list
    bases: list
    scalings: list
    factors: list
    stages: list
    steps: list
    seeds: list
    rt: Runtime
    bc: BatchConfig
    probe: Probe  # the recall probe's windows and depths
    windows: dict  # {L: Batches holding the fixed validation windows of L tokens}, L in s*L0 multiples

    @property
    def out(self):
        return Path(self.tc.out_dir)

    def models(self):
        """The base models' names: rope-b<base> for each RoPE base, then the other schemes."""
        return [f"rope-b{b:g}" for b in self.bases] + [s for s in self.schemes if s != "rope"]

    def base(self, name, seed, max_iters=None):
        """(out, model config, train config) of a base run (up to max_iters, its stage; default its end)."""
        scheme, _, b = name.partition("-b")
        gcfg = replace(self.gcfg.with_scheme(scheme), **({"rope_base": float(b)} if b else {}))
        tc = replace(self.tc, seed=seed, max_iters=max_iters or self.tc.max_iters, lr_decay_iters=self.tc.max_iters)
        return self.out / "base" / f"{name}-seed{seed}", gcfg, tc

    def finetune(self, b, scaling, s, seed):
        """(out, model config, train config) of a fine-tuning run of RoPE base b, its whole length."""
        L0 = self.gcfg.block_size
        base_out, base_cfg, _ = self.base(f"rope-b{b:g}", seed)
        gcfg = replace(base_cfg, block_size=round(s * L0), rope_scaling=scaling,
                       rope_scaling_factor=float(s) if scaling != rope.NO_SCALING else 1.0, original_len=L0)
        scale = self.ec.finetune_lr / self.tc.learning_rate  # Muon's rate, where it trains, scaled alike
        tc = replace(self.tc, seed=seed, init_from=str(base_out), learning_rate=self.ec.finetune_lr,
                     muon_lr=self.tc.muon_lr * scale, min_lr=self.ec.finetune_lr / 10,
                     warmup_iters=self.ec.finetune_warmup, max_iters=self.steps[-1],
                     lr_decay_iters=self.steps[-1], eval_interval=self.steps[-1],
                     batch_size=max(1, round(self.tc.batch_size / s)))
        return self.out / "finetune" / f"rope-b{b:g}-{scaling}-x{s:g}-seed{seed}", gcfg, tc


def make_lab(ec, gcfg, tc, bc):
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
    if not bc.recall_share:
        raise ValueError("recall_share=0: the lab's retrieval probe needs the task in training; set recall_share, "
                         "e.g. 0.5")
    stages = numbers("base_stages", ec.base_stages, int, 1, "250,500,1000")
    if stages[-1] != tc.max_iters:
        raise ValueError(f"base_stages={ec.base_stages!r} must end at max_iters={tc.max_iters}")
    steps = numbers("finetune_steps", ec.finetune_steps, int, 0, "0,50,100,200")
    if steps[0] != 0 or len(steps) < 2:
        raise ValueError(f"finetune_steps={ec.finetune_steps!r} must start at 0 (the base model) and go on")
    factors = numbers("factors", ec.factors, float, 1.0, "2,4")
    rt = eval_runtime(tc)
    per_forward = tc.batch_size * L0
    lengths = sorted({L0} | {round(m * L0) for s in factors for m in (s, 2 * s)})
    windows = eval_sets(dataset_dir, meta, lengths, ec.eval_tokens, per_forward, rt.device)
    lab = Lab(ec, gcfg, tc, schemes, numbers("rope_bases", ec.rope_bases, float, 1.0, "200,10000"), scalings,
              factors, stages, steps, [tc.seed + i for i in range(ec.seeds)], rt, bc,
              Probe(dataset_dir, meta, L0, ec, bc.recall_pairs, per_forward, rt.device), windows)
    for scaling in scalings:  # a bad setting fails now, not after the base models trained
        lab.finetune(lab.bases[0], scaling, factors[0], tc.seed)
    return lab


# ----------------------------------------------------------------------------- evaluation

def load_model(out, rt, **changes):
    model = model_from_checkpoint(load_checkpoint(out / "ckpt.pt", rt.device), rt.device).eval()
    return model.reconfigure(**changes) if changes else model


def losses(model, lab, lengths):
    """{L: mean val loss over the fixed windows of L tokens}."""
    return {str(L): position_losses(model, lab.windows[L], lab.rt).mean().item() for L in lengths}


# ----------------------------------------------------------------------------- runs

def check_settings(out, gcfg, tc, bc):
    """A run folder made with other settings is refused (max_iters aside: runs grow stage by stage)."""
    if (out / "config.json").is_file():
        saved = json.loads((out / "config.json").read_text())
        saved["train"]["max_iters"] = tc.max_iters
        check_same_settings(out, train_settings(gcfg, tc, bc), saved)


def base_run(lab, name, seed):
    """Train a base model; RoPE's in stages, probed at L0 after each (the learning curve); then its retrieval
    grid, RoPE's also with each scaling past L0. (figures, training seconds)."""
    out, gcfg, tc = lab.base(name, seed)
    check_settings(out, gcfg, tc, lab.bc)
    is_rope = name.startswith("rope")
    curve = {}
    for stage in lab.stages if is_rope else [tc.max_iters]:
        _, _, staged = lab.base(name, seed, stage)
        train_run(name, gcfg, staged, out, lab.bc)
        if is_rope:  # retrieval at L0 alone
            curve[str(stage)] = evaluated(out / f"curve{stage}.json", lambda: {str(gcfg.block_size): {
                str(d): lab.probe.recall.scores(load_model(out, lab.rt), lab.probe.windows[gcfg.block_size], d, lab.rt)
                for d in lab.probe.depths}})
    scalings = [rope.NO_SCALING] + [s for s in lab.scalings if s != rope.NO_SCALING and is_rope]
    probe = evaluated(out / "eval.json", lambda: {"retrieval": {s: lab.probe.grid(load_model(out, lab.rt), lab.rt, s)
                                                                for s in scalings}})
    summary = evaluated(out / "summary.json", lambda: train_run(name, gcfg, tc, out, lab.bc))
    return {"final_val_loss": summary["final_val_loss"], "curve": curve, **probe}, summary["train_s"]


def finetune_run(lab, b, scaling, s, seed):
    """Fine-tune in stages up to each scored step (a resume is exact, so the stages add up to one run), scoring
    the loss at L0, s*L0 and 2s*L0 and the retrieval grid after each. ({step: scores}, training seconds)."""
    out, gcfg, tc = lab.finetune(b, scaling, s, seed)
    check_settings(out, gcfg, tc, lab.bc)
    L0 = lab.gcfg.block_size
    lengths = [L0, round(s * L0), round(2 * s * L0)]
    base_out = lab.base(f"rope-b{b:g}", seed)[0]
    scored = {}
    for step in lab.steps:
        if step:
            summary = train_run(f"rope-b{b:g}-{scaling}-x{s:g}", gcfg, replace(tc, max_iters=step), out, lab.bc)
        # step 0: the base model with the scaling alone
        where, changes = (out, {}) if step else (base_out, {"rope_scaling": scaling,
                                                            "rope_scaling_factor": gcfg.rope_scaling_factor})
        scored[str(step)] = evaluated(out / f"step{step}.json", lambda: scores(lab, load_model(where, lab.rt, **changes),
                                                                                lengths))
    return scored, summary["train_s"]  # the clock of a resumed run runs on


def scores(lab, model, lengths):
    return {"loss": losses(model, lab, lengths), "retrieval": lab.probe.grid(model, lab.rt)}


def run_lab(lab):
    t0 = time.perf_counter()
    with RunLock(lab.out, "context-extension lab"):
        seeds = {"base": list(lab.seeds), "finetune": list(lab.seeds)}
        while True:
            done, train_s = run_all(lab, seeds)
            results = extend_report.lab_results(lab, done, seeds) | {"train_s": train_s}
            flagged = [c for c in results["claims"] if c["more_seeds"]]
            if not flagged or len(seeds["finetune"]) >= len(lab.seeds) + lab.ec.more_seeds:
                break
            # a p between 0.01 and 0.1 on the seeds run so far: more seeds for the RoPE runs the claims compare
            extra = [lab.seeds[-1] + i for i in range(1, lab.ec.more_seeds + 1)]
            print(f"{len(flagged)} claim(s) with p in [0.01, 0.1]: adding seeds {', '.join(map(str, extra))}")
            seeds = {k: v + extra for k, v in seeds.items()}
        results |= {"settings": {"extend": asdict(lab.ec), **train_settings(lab.gcfg, lab.tc, lab.bc)},
                    "device": lab.rt.device, "environment": run_record()}
        plots = extend_report.write_plots(results, lab.out)
        results["wall_s"] = time.perf_counter() - t0
        write_json(lab.out / "results.json", results)
        atomic_write(lab.out / "results.md", lambda f: f.write(extend_report.markdown(results, plots).encode()))
    print(f"results: {lab.out / 'results.md'}, results.json" + "".join(f", {f}" for f, _ in plots.written))


def run_all(lab, seeds):
    """({(kind, name, s, seed): figures} of every run, the training seconds they took): base models (other schemes
    on the first seeds only), then the fine-tunes, each after its base model."""
    jobs = [("base", name, None, seed) for seed in seeds["base"] for name in lab.models()
            if name.startswith("rope") or seed in lab.seeds[:lab.ec.scheme_seeds]]
    jobs += [("finetune", (b, sc), s, seed) for seed in seeds["finetune"] for b in lab.bases for s in lab.factors
             for sc in lab.scalings]
    done = run_jobs(jobs, run_job, lab, (make_lab, (lab.ec, lab.gcfg, lab.tc, lab.bc)), lab.ec.workers, needs=base_of,
                    label=job_label, desc="extend", progress=lab.tc.progress)
    return {job: figures for job, (figures, _) in done.items()}, sum(train_s for _, train_s in done.values())


def run_job(lab, job):
    """(figures, training seconds) of one run."""
    kind, name, s, seed = job
    return base_run(lab, name, seed) if kind == "base" else finetune_run(lab, *name, s, seed)


def base_of(job):
    """The base run a fine-tune starts from; None for a base run."""
    kind, name, _, seed = job
    return ("base", f"rope-b{name[0]:g}", None, seed) if kind == "finetune" else None


def job_label(job):
    kind, name, s, seed = job
    return f"{name} seed {seed}" if kind == "base" else f"rope-b{name[0]:g} {name[1]} x{s:g} seed {seed}"


def main(argv=None):
    command(argv, __doc__, ExtendConfig, lambda *settings: run_lab(make_lab(*settings)))


if __name__ == "__main__":
    main()
