"""The README quickstart as commands: prepare, train, sample; the shipped GPT-2 config, shrunk."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import config
import train
from conftest import ROOT, TINY, flags, log, run
from model import GPT, GPTConfig


@pytest.mark.slow
def test_prepare_train_sample(data_dir, tmp_path):
    out = tmp_path / "run"
    said = run(
        "train.py",
        "configs/shakespeare_char_cpu.toml",
        *TINY,
        "--max_iters=30",
        "--eval_interval=15",
        f"--data_dir={data_dir}",
        f"--out_dir={out}",
    ).stdout
    assert said.rstrip().endswith(f"loss curves: python plot.py --runs={out}")  # the next command, for the curves
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


def test_the_gpt2_124m_config_trains_shrunk_on_a_prepared_dataset(data_dir, tmp_path, one_thread):
    """configs/gpt2_124m.toml with its shape shrunk and a char dataset in place of OpenWebText (the gpt2
    tokenizer's files cannot be fetched offline): its recipe runs, with every setting not overridden kept."""
    path = ROOT / "configs" / "gpt2_124m.toml"
    model_cfg, train_cfg = config.parse([str(path), "--vocab_size=50257"], GPTConfig, train.TrainConfig)
    with torch.device("meta"):  # the full shape, without allocating it: GPT-2 small, no biases, no position table
        assert GPT(model_cfg).num_params() == 123_551_232
    assert (
        train_cfg.batch_size * model_cfg.block_size * train_cfg.gradient_accumulation_steps == 491_520
    )  # ~0.5M tokens a step

    out = tmp_path / "run"
    overrides = flags(
        data_dir,
        out,
        "--dataset=shakespeare_char",
        "--gradient_accumulation_steps=2",
        "--max_iters=3",
        "--warmup_iters=1",
        "--lr_decay_iters=3",
        "--eval_interval=3",
        "--log_interval=1",
    )
    train.main([str(path), *overrides])
    saved = json.loads((out / "config.json").read_text())
    overridden = {arg.removeprefix("--").split("=")[0] for arg in overrides}
    kept = {k: v for k, v in config.read_toml(path).items() if k not in overridden}
    assert {"learning_rate", "min_lr", "beta2", "weight_decay", "grad_clip", "bias", "pos_emb"} <= kept.keys()
    assert kept == {k: (saved["model"] | saved["train"])[k] for k in kept}
    lines = log(out)
    assert [m["iter"] for m in lines if "train_loss" in m] == [1, 2, 3] and lines[-1]["iter"] == 3
    assert all(np.isfinite(m.get("train_loss", m.get("val_loss"))) for m in lines)


def test_the_installed_project_puts_none_of_its_modules_on_other_projects_import_path(tmp_path):
    """`pip install -e .` installs the dependencies only: from another folder, none of our generic module names
    (config, model, train, ...) is importable, so none shadows another project's."""
    ours = sorted({p.stem for p in ROOT.glob("*.py")} | {"data", "lab"})
    found = subprocess.run(
        [sys.executable, "-c", f"import importlib.util as u, sys; print([m for m in {ours!r} if u.find_spec(m)])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=True,
    )
    assert found.stdout.strip() == "[]"


def test_a_tool_typed_as_a_path_says_in_one_line_how_to_run_it():
    """python lab/extend.py, as nanoGPT's users type a tool: the import path then holds lab/, not the project, so every
    tool under lab/ and data/ stops before its imports, with one line naming its module form and no traceback."""
    modules = sorted([*ROOT.glob("lab/*.py"), *ROOT.glob("data/*.py")])
    tools = [p for p in modules if 'if __name__ == "__main__":' in p.read_text()]
    assert len(tools) >= 4  # ablate, extend, recipe, prepare
    for path in tools:
        said = run(path.relative_to(ROOT), "--help", check=False)
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        assert said.returncode != 0 and not said.stdout and len(said.stderr.splitlines()) == 1, said.stderr
        assert f"from the project's folder: python -m {module} " in said.stderr
