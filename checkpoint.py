"""Checkpoints: the format (written and read here alone), safe (weights_only) loads, the checks a resume needs, and a
training run's folder (config.json, the resume command). Where a model to sample or fine-tune comes from is source.py's.

A checkpoint is a plain dict of tensors, numbers and strings, so torch.load(weights_only=True) reads
it; model weights are saved from the unwrapped module, without any compile prefix.
"""

import json
import random
import re
import shlex
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from config import build, current_names, declared, given, resumed
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
    # checkpoints written before the model's positional scheme was named `scheme` hold its parameters under "pos."
    ckpt["model"] = {
        "scheme." + k.removeprefix("pos.") if k.startswith("pos.") else k: v for k, v in ckpt["model"].items()
    }
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


def same_tokenizer(meta, other):
    return all(meta.get(k) == other.get(k) for k in TOKENIZER_KEYS)


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


def run_info(model_cfg, train_cfg, batch_cfg, schedule, meta, runtime):
    """What every checkpoint of a run carries beside its state: its train settings, tokenizer (meta) and record, which
    is config.json's contents: the model, train and batch settings, the schedule's own, the dtype the run computes in
    (what auto resolved to), code, environment, processes."""
    record = {
        "model": model_cfg.asdict(),
        "train": asdict(train_cfg),
        "batches": asdict(batch_cfg),
        "schedule": schedule.settings(),
        "dtype": runtime.dtype_name,
        **run_record(),
        "world_size": runtime.world_size,
    }
    return {"train_config": asdict(train_cfg), "tokenizer": meta, "record": record}


def first_files(out, record, at, resume):
    """A run's first files in its folder out: metrics.jsonl cut to iteration at (a fresh run's log starts empty, a
    resumed one's at its step) and config.json, its record, which run_settings reads back."""
    trim_log(out / "metrics.jsonl", at)
    if resume:
        print(f"resuming from {out / 'ckpt.pt'} at iteration {at}, in {record['dtype']}")
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
