"""Checkpoints: atomic writes, safe (weights_only) loads, the RNG state a resume needs, a model from a file.

A checkpoint is a plain dict of tensors, numbers and strings, so torch.load(weights_only=True) reads
it; model weights are saved from the unwrapped module, without any compile prefix.
"""

import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from files import atomic_write
from model import GPT, GPTConfig

RESUME_KEYS = ("model", "optimizer", "scaler", "iter", "best_val_loss", "rng", "tokenizer")
CHECKPOINTS = {"best": ("best.pt", "ckpt.pt"), "latest": ("ckpt.pt",)}  # a run's file names tried, in order


def rng_state():
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # numpy's key array is stored as a tensor: weights_only loading accepts no numpy objects
            "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:])}


def set_rng_state(state):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


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
            raise ValueError(f"refused to load {str(path)!r}: it asks to call {code[1]}, not just to hold tensors and "
                             "plain data; weights_only loading never runs such code (use checkpoints you trust)") from None
        why = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), str(e).partition(". ")[0])
        raise ValueError(f"{str(path)!r} is not a readable checkpoint, it is truncated or corrupt "
                         f"({type(e).__name__}: {why[:120]})") from None
    if not isinstance(ckpt, dict) or not {"model", "model_config"} <= ckpt.keys():
        raise ValueError(f"{str(path)!r} is not a nanorope checkpoint (it lacks the model and model_config entries)")
    return ckpt


def checkpoint_in(out_dir, which):
    """The checkpoint file in the run folder out_dir that `which` (best, latest) names, or None."""
    return next((Path(out_dir) / n for n in CHECKPOINTS[which] if (Path(out_dir) / n).is_file()), None)


def load_run(path, which="latest", device="cpu"):
    """(file, checkpoint) of a training run: path is a checkpoint file, or a run folder whose `which` checkpoint is
    taken. One without the tokenizer train.py saves (weights alone) is refused: sampling, export and fine-tuning
    all need it."""
    path = Path(path)
    if not path.is_file():  # a run folder, or a missing one
        found = checkpoint_in(path, which)
        if found is None:
            raise ValueError(f"no checkpoint in {str(path)!r} (looked for {' or '.join(CHECKPOINTS[which])}); train "
                             f"first (python train.py --out_dir={path}) or pass the run's folder")
        path = found
    ckpt = load_checkpoint(path, device)
    if "tokenizer" not in ckpt:
        raise ValueError(f"{str(path)!r} is not a nanorope checkpoint (it lacks the tokenizer entry)")
    return path, ckpt


def model_from_checkpoint(ckpt, device="cpu", path="the checkpoint"):
    """The GPT a load_checkpoint dict describes; one whose config or weights are another model's is refused."""
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, RuntimeError) as e:  # config keys or weight shapes of another model
        raise ValueError(f"{str(path)!r} does not fit nanorope's model: {str(e).splitlines()[0][:200]}") from None
    return model.to(device)


def config_diff(ckpt, config, meta, may_differ, saved=None):
    """['key: checkpoint X, now Y', ...] for each model setting outside may_differ in which the checkpoint's (or the
    saved config given) differs from config, and for a vocabulary that differs from the dataset's (meta)."""
    saved = GPTConfig().asdict() | (saved or ckpt["model_config"])  # a setting newer than the checkpoint: its default
    diff = [f"{k}: checkpoint {saved[k]!r}, now {v!r}" for k, v in config.asdict().items()
            if saved[k] != v and k not in may_differ]
    if any(ckpt["tokenizer"].get(k) != meta.get(k) for k in ("tokenizer", "chars", "eot", "bpe_ranks")):
        diff.append(f"tokenizer: dataset {meta['dataset']!r} has another vocabulary")
    return diff


def init_from_checkpoint(model, path, meta):
    """Fine-tuning's start: model's weights from the checkpoint at path (a file, or a run folder holding ckpt.pt).
    Only what no weight depends on may differ: the context length, the RoPE scaling, dropout."""
    path, ckpt = load_run(path)
    diff = config_diff(ckpt, model.config, meta, may_differ=("block_size", "dropout", "rope_scaling",
                                                            "rope_scaling_factor", "rope_original_len"))
    if diff:
        raise ValueError(f"init_from={str(path)!r} is another model (" + "; ".join(diff) + "); only block_size, "
                         "dropout and the RoPE scaling may change when fine-tuning")
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:  # e.g. learned positions: their table's size is block_size
        raise ValueError(f"init_from={str(path)!r}: its weights do not fit this model "
                         f"({str(e).splitlines()[-1].strip()[:200]})") from None


def resumable_checkpoint(path, config, meta, max_iters, optimizer="adamw"):
    """ckpt.pt, loaded to the CPU (RNG states must stay there), or a refusal naming every field in which config
    differs from the run's model config as it started (its record: a DroPE run's model has lost RoPE by its later
    checkpoints), or its other optimizer."""
    ckpt = load_checkpoint(path)
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise ValueError(f"cannot resume from {str(path)!r}: it lacks {', '.join(missing)} (it holds weights only); "
                         "start a new run in another out_dir")
    saved = ckpt.get("train_config", {}).get("optimizer", "adamw")  # checkpoints from before the option: AdamW
    if saved != optimizer:
        raise ValueError(f"cannot resume: the checkpoint was trained with optimizer={saved!r}, this run asks for "
                         f"optimizer={optimizer!r}, whose state it does not hold; pass --optimizer={saved} or use a "
                         "new out_dir")
    started = ckpt.get("record", {}).get("model")  # checkpoints from before the record: the model's own config
    diff = config_diff(ckpt, config, meta, may_differ=("dropout",), saved=started)
    if diff:
        raise ValueError("cannot resume: this run's model differs from the checkpoint's (" + "; ".join(diff) +
                         f"); pass the settings in {str(path.parent / 'config.json')!r} or use a new out_dir")
    if ckpt["iter"] >= max_iters:
        raise ValueError(f"nothing to do: the checkpoint is at iteration {ckpt['iter']} and max_iters={max_iters}; "
                         "raise max_iters to train on")
    return ckpt
