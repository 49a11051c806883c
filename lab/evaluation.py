"""What the lab scores its models on: fixed validation windows at each length, the loss at each position of them,
the device and precision it evaluates in, and the model of a run folder's checkpoint, checked to be at its step."""

import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from data.loader import Batches
from lab.grid import Gone
from runtime import Runtime, pick_device, pick_dtype


def eval_sets(dataset_dir, meta, lengths, n_tokens, tokens_per_forward, device):
    """{L: Batches whose fixed validation set holds about n_tokens in windows of L tokens}. Batches draws
    that set from EVAL_SEED alone, so every model of the grid is scored on the same windows."""
    sets = {}
    for L in lengths:
        rows = max(1, tokens_per_forward // L)  # windows per forward: long ones cost O(L^2) attention memory
        try:  # (seed 0: these Batches' training batches are never drawn)
            sets[L] = Batches(dataset_dir, meta, L, rows, 0, device, eval_iters=max(1, n_tokens // (rows * L)))
        except ValueError as e:  # the window does not fit a split
            raise ValueError(f"eval length {L} does not fit the data: {e}; use smaller eval_lengths") from None
    return sets


@torch.no_grad()
def position_losses(model, batches, runtime):
    """(L,) float64 mean loss at each position 0..L-1 over the fixed validation windows of batches."""
    total, n = torch.zeros(batches.block_size, dtype=torch.float64), 0
    for x, y in batches.eval_batches("val"):  # (B, L) each
        with runtime.autocast():
            loss = model(x, y, reduction="none")[1]  # (B, L)
        total += loss.sum(0).double().cpu()
        n += len(y)
    return total / n


@torch.no_grad()
def context_value(model, batches, L0, runtime):
    """{"L0": loss with L0 tokens of context, "whole": with the whole window}: the mean loss over the last L0 // 4
    tokens of the fixed validation windows of batches (longer than L0), read once from the window's last L0 tokens
    alone and once from the whole window. The same tokens both times, so the difference is what the context past L0
    is worth to the model on this text, the ceiling of what a loss claim past L0 can show."""
    tail, short, whole, n = max(1, L0 // 4), 0.0, 0.0, 0
    for x, y in batches.eval_batches("val"):  # (B, L) each
        with runtime.autocast():
            whole += model(x, y, reduction="none")[1][:, -tail:].double().sum().item()
            short += model(x[:, -L0:], y[:, -L0:], reduction="none")[1][:, -tail:].double().sum().item()
        n += len(y) * tail
    return {"L0": short / n, "whole": whole / n}


def eval_runtime(train_cfg):
    """The device and precision the lab evaluates in: the training settings', without compile or DDP."""
    device, _ = pick_device(train_cfg.device)
    return Runtime(device, pick_dtype(train_cfg.dtype, device.split(":")[0]), compile=False)


def checked_model(out, runtime, step=None, **changes):
    """The model of out's checkpoint, at iteration step where given (a figure is never filed under another step),
    reconfigured by changes (GPT.reconfigure) where given. Raises Gone where training has moved past step."""
    ckpt = load_checkpoint(out / "ckpt.pt", runtime.device)
    if step is not None and ckpt["iter"] > step:  # the run keeps its latest checkpoint alone
        raise Gone(
            f"the model it scores, at iteration {step}, is gone ({out / 'ckpt.pt'} is at iteration {ckpt['iter']})"
        )
    assert step is None or ckpt["iter"] == step, f"{out / 'ckpt.pt'} is at iteration {ckpt['iter']}, not {step}"
    model = model_from_checkpoint(ckpt, runtime.device).eval()
    return model.reconfigure(**changes) if changes else model
