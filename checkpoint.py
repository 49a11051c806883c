"""Checkpoints: the format (written and read here alone), safe (weights_only) loads, the checks a resume needs, and
`load_source`: a model and its tokenizer from a run folder, a checkpoint file or a transformers checkpoint.

A checkpoint is a plain dict of tensors, numbers and strings, so torch.load(weights_only=True) reads
it; model weights are saved from the unwrapped module, without any compile prefix.
"""

import json
import random
import re
import shlex
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

import positions
from config import build, current_names, declared, given, resumed, weightless
from data.tokenizer import HF_PREFIX
from files import WriteError, atomic_write, trim_log
from model import GPT, GPTConfig
from runtime import run_record

RESUME_KEYS = ("model", "optimizer", "scaler", "iter", "best_val_loss", "rng", "tokenizer")
CHECKPOINTS = {"best": ("best.pt", "ckpt.pt"), "latest": ("ckpt.pt",)}  # a run's file names tried, in order
TOKENIZER_KEYS = ("tokenizer", "chars", "eot", "bpe_ranks", "hf_tokenizer")  # what tells two vocabularies apart


# ----------------------------------------------------------------------------- the format


def rng_state():
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # numpy's key array is stored as a tensor: weights_only loading accepts no numpy objects
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }


def set_rng_state(state):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def pack(state, info):
    """A training checkpoint of state (train.TrainState: the unwrapped model, optimizer, loss scaler, progress) and
    the run's info (its settings, tokenizer and record), with the RNG states a resume restores."""
    return {
        "model": state.model.state_dict(),
        "model_config": state.model.config.asdict(),
        "optimizer": state.optimizer.state_dict(),
        "scaler": state.scaler.state_dict() if state.scaler.is_enabled() else {},
        "iter": state.iter,
        "best_val_loss": state.best_val,
        "rng": rng_state(),
        "elapsed_s": state.elapsed(),
        **info,
    }


def unpack(state, ckpt):
    """Restore state from a checkpoint pack wrote (resumable_checkpoint has checked it)."""
    state.model.load_state_dict(ckpt["model"])
    state.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"]:
        state.scaler.load_state_dict(ckpt["scaler"])
    state.iter = state.saved_at = ckpt["iter"]
    state.best_val = ckpt["best_val_loss"]
    state.started = time.perf_counter() - ckpt.get("elapsed_s", 0.0)  # the clock runs on from the checkpoint's
    set_rng_state(ckpt["rng"])


def save_checkpoint(obj, path):
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path, device="cpu"):
    """A checkpoint dict, loaded with weights_only=True so a foreign pickle can never run code."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {str(path)!r}; train first (python train.py ...) or pass the right out_dir")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the pickle protocol of files it then refuses
            ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # arbitrary bytes make torch.load fail in arbitrary ways; each means "not loadable"
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if code:
            raise ValueError(
                f"refused to load {str(path)!r}: it asks to call {code[1]}, not just to hold tensors and "
                "plain data; weights_only loading never runs such code (use checkpoints you trust)"
            ) from None
        why = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), str(e).partition(". ")[0])
        raise ValueError(
            f"{str(path)!r} is not a readable checkpoint, it is truncated or corrupt ({type(e).__name__}: {why[:120]})"
        ) from None
    if not isinstance(ckpt, dict) or not {"model", "model_config"} <= ckpt.keys():
        raise ValueError(f"{str(path)!r} is not a nanorope checkpoint (it lacks the model and model_config entries)")
    ckpt["model_config"] = current_names(GPTConfig, ckpt["model_config"])
    return ckpt


def checkpoint_in(out_dir, which):
    """The checkpoint file in the run folder out_dir that `which` (best, latest) names, or None."""
    return next((Path(out_dir) / n for n in CHECKPOINTS[which] if (Path(out_dir) / n).is_file()), None)


def model_from_checkpoint(ckpt, device="cpu", path="the checkpoint"):
    """The GPT a load_checkpoint dict describes; one whose config or weights are another model's is refused."""
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, RuntimeError) as e:  # config keys or weight shapes of another model
        raise ValueError(f"{str(path)!r} does not fit nanorope's model: {str(e).splitlines()[0][:200]}") from None
    return model.to(device)


# ----------------------------------------------------------------------------- sources: what a model comes from


@dataclass
class Source:
    """A model to sample, export or fine-tune: its config, its tokenizer (meta), what it is (label, e.g. the
    checkpoint's path), its run's figures (iter, best_val_loss) and how its weights go into a model."""

    config: GPTConfig
    meta: dict
    label: str
    info: dict
    load_into: Callable  # a GPT of a config fine_tune_config allows -> the same GPT holding the source's weights

    def model(self, device="cpu"):
        return self.load_into(GPT(self.config)).to(device)


def load_source(spec, flag, which="latest"):
    """The Source spec names: a run folder (its `which` checkpoint), a checkpoint file, or hf:NAME_OR_PATH (a
    transformers GPT-2 or GPT-NeoX checkpoint, with its own tokenizer). Every error is one line naming the setting
    the user typed, flag=spec."""
    where = f"{flag}={spec}"
    if spec.startswith(HF_PREFIX):
        import hf  # transformers is imported where it is used

        config, meta, load_into = hf.source(spec.removeprefix(HF_PREFIX), where)
        return Source(config, meta, spec, {}, load_into)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"{where}: no such run folder or checkpoint file")
    if path.is_dir():
        found = checkpoint_in(path, which)
        if found is None:
            raise ValueError(
                f"{where}: no checkpoint in that folder (looked for {' or '.join(CHECKPOINTS[which])}); "
                f"train first (python train.py --out_dir={spec}) or name the run's folder"
            )
        path = found
    try:
        ckpt = load_checkpoint(path)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if "tokenizer" not in ckpt:
        raise ValueError(f"{where}: {str(path)!r} holds weights alone, without the tokenizer train.py saves")

    def load_into(model):
        try:
            model.load_trained(ckpt["model"])
        except RuntimeError as e:  # weights of another shape: a config fine_tune_config would not allow
            raise ValueError(
                f"{where}: its weights do not fit this model ({str(e).splitlines()[-1].strip()[:200]})"
            ) from None
        return model

    try:
        config = GPTConfig(**ckpt["model_config"])
    except TypeError as e:  # settings of another program or version
        raise ValueError(f"{where}: {str(path)!r} does not fit nanorope's model ({e})") from None
    return Source(config, ckpt["tokenizer"], str(path), {k: ckpt.get(k) for k in ("iter", "best_val_loss")}, load_into)


def same_tokenizer(meta, other):
    return all(meta.get(k) == other.get(k) for k in TOKENIZER_KEYS)


def tokenizer_name(meta):
    return f"the {meta['tokenizer']} tokenizer" + (f" of {meta['hf_name']}" if meta["tokenizer"] == "hf" else "")


def fine_tune_config(source, config, meta, where):
    """The model config of a fine-tune from source on a dataset (its meta): the source's architecture with config's
    settings that no weight depends on (config.weightless: context, dropout, RoPE scaling), and L0 the source's own
    wherever block_size grows past it (a typed original_len must equal it). Any other setting of config that is not
    at its default must equal the source's, and the dataset must be tokenized as the source was. A block_size below
    the source's is allowed: a learned position table is cut to it (GPT.load_trained)."""
    if not same_tokenizer(source.meta, meta):
        hint = (
            f"; prepare it with python -m data.prepare --tokenizer hf:{source.meta['hf_name']} --input CORPUS "
            "--dataset NAME"
            if source.meta["tokenizer"] == "hf"
            else ""
        )
        raise ValueError(
            f"{where} reads the ids of {tokenizer_name(source.meta)}, but dataset {meta['dataset']!r} was "
            f"prepared with {tokenizer_name(meta)}{hint}"
        )
    defaults, kept = GPTConfig(), weightless(GPTConfig)
    clash = [
        f"{k}: {where} has {v!r}, this run {getattr(config, k)!r}"
        for k, v in source.config.asdict().items()
        if k not in kept and k != "vocab_size" and getattr(config, k) not in (v, getattr(defaults, k))
    ]
    if clash:
        raise ValueError(
            f"{where} is another model ({'; '.join(clash)}); a fine-tune keeps its architecture and may "
            f"change only {', '.join(kept)}"
        )
    if not positions.scheme(source.config.pos_emb).extrapolates and config.block_size > source.config.block_size:
        raise ValueError(
            f"block_size={config.block_size} is past {where}'s learned position table "
            f"({source.config.block_size} positions); use block_size <= {source.config.block_size}"
        )
    L0 = min(source.config.L0, config.block_size)
    if config.original_len not in (None, L0):
        raise ValueError(
            f"original_len={config.original_len} contradicts {where}, which learned L0 = "
            f"{source.config.L0}: a fine-tune keeps the length its model first learned"
            + (f" (at block_size={config.block_size}, L0 = {L0})" if L0 != source.config.L0 else "")
        )
    return replace(source.config, **{k: getattr(config, k) for k in kept} | {"original_len": L0})


def start_model(init_from, config, meta):
    """A run's model config on a dataset (its meta) and the Source of its first weights: config with the dataset's
    vocabulary and None (fresh weights), or a fine-tune's config (fine_tune_config) and init_from's Source."""
    if not init_from:
        return replace(config, vocab_size=meta["vocab_size"]), None
    source = load_source(init_from, "init_from")
    return fine_tune_config(source, config, meta, f"init_from={init_from}"), source


def starting_point(train_cfg, config, meta, out):
    """Where a run starts: (its model config, the Source of a fine-tune's first weights or None, a resume's
    checkpoint in out or None), each refused here where it contradicts the run."""
    config, source = start_model(train_cfg.init_from, config, meta)
    if not train_cfg.resume:
        return config, source, None
    return config, source, resumable_checkpoint(out, config, meta, train_cfg.max_iters, train_cfg.optimizer)


def run_settings(argv, parts, out_dir):
    """The settings of a training command, [CONFIG.toml] [--key=value ...]: one instance of each class of parts
    ({config.json's part: its settings class}). A resume continues the run as it was started, with the settings it
    recorded (out_dir/config.json; out_dir: the setting's default) but for those the command gives (config.resumed),
    each read under the name it has now (a setting renamed since the run started, rope_original_len -> original_len,
    is checked as the one it is); a folder without a config.json leaves the checkpoint's own checks."""
    classes = tuple(parts.values())
    typed = given(argv, *classes)
    path = Path(typed.get("out_dir", out_dir)) / "config.json"
    if not typed.get("resume") or not path.is_file():
        return build(typed, *classes)
    try:
        record = json.loads(path.read_text())
        run = {k: v for part, cls in parts.items() for k, v in current_names(cls, record.get(part, {})).items()}
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(
            f"cannot resume: {path} is damaged ({type(e).__name__}: {str(e)[:120]}); pass every "
            "setting of the run with --resume, or use a new out_dir"
        ) from None
    return resumed(typed, run, classes, path)


def resumable_checkpoint(out, config, meta, max_iters, optimizer="adamw"):
    """The run folder out's ckpt.pt, loaded to the CPU (RNG states must stay there), or a refusal naming every field
    in which config differs from the run's model config as it started (its record: a schedule may change the model's
    config later, as DroPE's drop does), or its other optimizer."""
    path = Path(out) / "ckpt.pt"
    ckpt = load_checkpoint(path)
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise ValueError(
            f"cannot resume from {str(path)!r}: it lacks {', '.join(missing)} (it holds weights only); "
            "start a new run in another out_dir"
        )
    saved = ckpt.get("train_config", {}).get("optimizer", "adamw")  # checkpoints from before the option: AdamW
    if saved != optimizer:
        raise ValueError(
            f"cannot resume: the checkpoint was trained with optimizer={saved!r}, this run asks for "
            f"optimizer={optimizer!r}, whose state it does not hold; pass --optimizer={saved} or use a "
            "new out_dir"
        )
    started = ckpt.get("record", {}).get("model", ckpt["model_config"])  # before the record: the model's own
    started = GPTConfig(**current_names(GPTConfig, started)).resolved()  # a newer setting: its default
    resumable = declared("resume", GPTConfig)  # once, not per setting
    diff = [
        f"{k}: checkpoint {started[k]!r}, now {v!r}"
        for k, v in config.resolved().items()
        if started[k] != v and k not in resumable
    ]
    if not same_tokenizer(ckpt["tokenizer"], meta):
        diff.append(f"tokenizer: dataset {meta['dataset']!r} has another vocabulary")
    if diff:
        raise ValueError(
            "cannot resume: this run's model differs from the checkpoint's ("
            + "; ".join(diff)
            + f"); pass the settings in {str(path.parent / 'config.json')!r} or use a new out_dir"
        )
    if ckpt["iter"] >= max_iters:
        raise ValueError(
            f"nothing to do: the checkpoint is at iteration {ckpt['iter']} and max_iters={max_iters}; "
            "raise max_iters to train on"
        )
    return ckpt


# ----------------------------------------------------------------------------- a training run's folder


def check_out_dir(out_dir, resume):
    """out_dir as a Path: refused if it is a file, or if it holds a run's ckpt.pt and this run is not its resume."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out_dir={out_dir!r} is a file; give a folder path")
    if not resume and (path / "ckpt.pt").exists():
        raise ValueError(
            f"out_dir={out_dir!r} already holds a run's ckpt.pt; continue it with --resume=true, "
            "or start afresh in another out_dir (or after deleting that one)"
        )
    return path


def run_info(model_cfg, train_cfg, batch_cfg, schedule, meta, world_size):
    """What every checkpoint of a run carries beside its state: its train settings, tokenizer (meta) and record, which
    is config.json's contents: the model, train and batch settings, the schedule's own, code, environment, processes."""
    record = {
        "model": model_cfg.asdict(),
        "train": asdict(train_cfg),
        "batches": asdict(batch_cfg),
        "schedule": schedule.settings(),
        **run_record(),
        "world_size": world_size,
    }
    return {"train_config": asdict(train_cfg), "tokenizer": meta, "record": record}


def first_files(out, record, at, resume):
    """A run's first files in its folder out: metrics.jsonl cut to iteration at (a fresh run's log starts empty, a
    resumed one's at its step) and config.json, its record, which run_settings reads back."""
    trim_log(out / "metrics.jsonl", at)
    if resume:
        print(f"resuming from {out / 'ckpt.pt'} at iteration {at}")
    atomic_write(out / "config.json", lambda f: f.write((json.dumps(record, indent=2) + "\n").encode()))


def save_run(state, val_loss, out, info):
    """out_dir/ckpt.pt after every evaluation, and best.pt when val_loss is the run's lowest yet."""
    if val_loss < state.best_val:
        state.best_val = val_loss
        save_checkpoint(pack(state, info), out / "best.pt")
    save_checkpoint(pack(state, info), out / "ckpt.pt")


def last_checkpoint(state, out):
    """Where a run that stops on an error left its work: its last checkpoint, or none yet."""
    if state.saved_at is None:
        return "no checkpoint had been written yet"
    return f"the last checkpoint, {out / 'ckpt.pt'} (iteration {state.saved_at}), is untouched"


def resume_command(argv, world_size):
    """The command that resumes a stopped run: argv's with --resume=true (under torchrun, a hint alone)."""
    if argv is None or world_size > 1:
        return "run the same command with --resume=true"
    args = [a for a in argv if not a.startswith("--resume")] + ["--resume=true"]
    return f"python train.py {shlex.join(args)}"


def write_failed(e, state, out, argv, world_size):
    """The error that stops a run whose file a full or read-only device refused (e, a WriteError): e, with the last
    checkpoint and the command that goes on once there is room."""
    again = resume_command(argv, world_size) if state.saved_at is not None else "run the same command again"
    return WriteError(f"{e}; {last_checkpoint(state, out)}; once there is room: {again}")
