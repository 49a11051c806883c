"""The README quickstart as commands: prepare, train, sample."""

import json

import torch

from conftest import TINY, run


def test_prepare_train_sample(data_dir, tmp_path):
    out = tmp_path / "run"
    said = run("train.py", "configs/shakespeare_char_cpu.toml", *TINY, "--max_iters=30", "--eval_interval=15",
               f"--data_dir={data_dir}", f"--out_dir={out}").stdout
    assert said.rstrip().endswith(f"loss curves: python plot.py {out}")  # the next command, for the curves
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in lines if "val_loss" in m]
    assert [m["iter"] for m in evals] == [15, 30]
    assert all({"iter", "lr", "tokens_per_s", "elapsed_s", "val_bpb"} <= m.keys() for m in evals)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] < 4.2  # learning, from ln(65) = 4.17 at the start
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["n_embd"] == 32 and config["train"]["max_iters"] == 30 and config["code_version"]
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 30 and not any(k.startswith("_orig_mod") for k in ckpt["model"])

    text = run("sample.py", f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=40", "--seed=3").stdout
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 40 + 1  # char-level, then a newline
    again = run("sample.py", f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=40", "--seed=3").stdout
    assert again == text
