"""runtime.py: the automatic device and dtype choices, and the guard that a float32 run computes in float32."""

import json

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import config
import runtime
import sample
import scalings
import train
from checkpoint import load_checkpoint, model_from_checkpoint
from conftest import flags
from data.batches import BatchConfig
from generate import GREEDY, generate
from lab import ablate
from model import GPTConfig, all_schemes

AMD = {"sse4a": True}  # the flag that tells an AMD CPU from an Intel one


@pytest.mark.parametrize(
    "caps, level, expected",
    [
        ({"avx512_bf16": True, "amx_bf16": False, **AMD}, "AVX512", torch.bfloat16),  # AMD Zen 4 on: native bf16
        ({"avx512_bf16": True, "amx_bf16": True}, "AVX512", torch.bfloat16),  # Intel with AMX
        ({"avx512_bf16": False, "amx_bf16": True}, "AVX512", torch.bfloat16),
        ({"avx512_bf16": True, "amx_bf16": False}, "AVX512", torch.float32),  # Intel's AVX512-BF16 without AMX
        ({"avx512_bf16": True, "amx_bf16": False, **AMD}, "AVX2", torch.float32),  # kernels held to AVX2: emulated
        ({"avx512_bf16": False, "amx_bf16": False, "avx2": True, **AMD}, "AVX2", torch.float32),  # emulated
        ({}, "DEFAULT", torch.float32),  # a CPU torch reports nothing of
    ],
)
def test_auto_dtype_on_cpu_is_bfloat16_only_on_cpus_with_native_fast_bf16(monkeypatch, caps, level, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: level)
    assert runtime.pick_dtype("auto", "cpu") == expected
    assert runtime.pick_dtype("float32", "cpu") == torch.float32  # an explicit choice is kept
    assert runtime.pick_dtype("auto", "mps") == torch.float32


@pytest.mark.parametrize("caps", [{"avx512_bf16": True, **AMD}, {"amx_bf16": True}])
def test_auto_dtype_does_not_change_with_the_load(monkeypatch, caps):
    """The rule reads the CPU alone, where bf16 is native too: auto never times a matmul, so a loaded machine (matmuls
    many times slower) picks as an idle one."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    slow = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: pytest.fail("auto timed a matmul") or slow(a, b))
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: pytest.fail("auto timed a matmul"))
    assert all(runtime.pick_dtype("auto", "cpu") == torch.bfloat16 for _ in range(3))


@pytest.mark.parametrize("another_rank_chose_float32, expected", [(True, torch.float32), (False, torch.bfloat16)])
def test_under_torchrun_auto_cpu_dtype_is_bfloat16_only_if_every_process_chose_it(
    monkeypatch, another_rank_chose_float32, expected
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(runtime, "cpu_prefers_bf16", lambda: True)  # this node's CPU
    monkeypatch.setattr(runtime.dist, "init_process_group", lambda backend: None)
    monkeypatch.setattr(runtime, "any_rank", lambda flag, run_time: flag or another_rank_chose_float32)
    assert runtime.setup_runtime("cpu", "auto", quiet=True).dtype == expected
    assert runtime.setup_runtime("cpu", "bfloat16", quiet=True).dtype == torch.bfloat16  # an explicit choice is kept


def test_decoding_autocasts_on_cuda_only_and_picks_no_dtype_elsewhere(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_prefers_bf16", lambda: pytest.fail("decoding picked a CPU dtype"))
    with runtime.decode_autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with runtime.decode_autocast("cpu", torch.bfloat16):  # a training run's dtype: still off for decoding on CPU
        assert not torch.is_autocast_enabled("cpu")


# ----------------------------------------------------------------------------- the float32 guard

MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "matmul", "linear", "_addmm_activation"}
REDUCED = (torch.bfloat16, torch.float16)


class ReducedPrecisionMatmuls(TorchDispatchMode):
    """Records every matmul-class op (matrix products, the SDPA kernels) that sees a bf16 or float16 tensor: on a
    CPU without native bf16 each such op is emulated, ~70x slower than float32's."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS or "scaled_dot_product" in name or "attention" in name:
            dtypes = {t.dtype for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            if dtypes & set(REDUCED):
                self.seen.append(f"{func} on {sorted(map(str, dtypes))}")
        return func(*args, **(kwargs or {}))


def test_the_guard_sees_a_bf16_newton_schulz():  # torch.optim.Muon's, the cliff the guard exists for
    p = torch.nn.Parameter(torch.randn(8, 4))
    p.grad = torch.randn(8, 4)
    with ReducedPrecisionMatmuls() as guard:
        torch.optim.Muon([p]).step()
    assert guard.seen and "aten.mm" in guard.seen[0] and "torch.bfloat16" in guard.seen[0]


@pytest.mark.parametrize(
    "settings",
    [
        ["--optimizer=adamw"],
        ["--optimizer=muon"],
        ["--optimizer=muon", "--qk_norm"],
        ["--mlp_act=relu2"],
        ["--logit_softcap=15"],
        ["--tie_embeddings=false"],
        ["--optimizer=muon", "drope"],
        ["--pose_factor=2", "--task=recall", "--recall_share=0.5", "--recall_pairs=2"],
    ],  # per-row position ids, task rows
    ids=lambda s: ",".join(a.removeprefix("--") for a in s),
)
def test_a_float32_run_computes_no_matmul_in_reduced_precision(data_dir, tmp_path, settings):
    """One training step with each optimizer and recipe option (DroPE's drop at step 1 too), its evaluation, and
    cached decoding of its model, all in float32 on the CPU: not one matrix product may see a bf16 or float16."""
    out, drope = tmp_path / "run", "drope" in settings
    argv = flags(data_dir, out, "--max_iters=2", "--eval_interval=2", *(s for s in settings if s != "drope"))
    model_cfg, train_cfg, batch_cfg = config.parse(argv, GPTConfig, train.TrainConfig, BatchConfig)
    with ReducedPrecisionMatmuls() as guard:
        train.train(model_cfg, train_cfg, batch_cfg, ablate.DropSchedule(train_cfg, ablate.DroPE(1)) if drope else None)
        model = model_from_checkpoint(load_checkpoint(out / "ckpt.pt"))
        assert model.config.pos_emb == ("none" if drope else "rope")
        for _ in generate(model, torch.zeros((1, 3), dtype=torch.long), 2, GREEDY):  # the prompt, one cached step
            pass
    assert not guard.seen, "reduced-precision matmuls in a float32 run:\n" + "\n".join(guard.seen[:5])


def test_the_labs_float32_scoring_computes_no_matmul_in_reduced_precision(data_dir):
    """The extension lab's scores in float32 on the CPU: the probe's contexts read once into a KV cache with each
    query forked, the same windows read whole, the slot check, and what context past L0 is worth. Its timed budget
    holds on a CPU without native bf16 only if none of them leaves float32."""
    from data.tokenizer import load_meta
    from lab.evaluation import context_value, eval_sets
    from lab.retrieval import Probe, ProbeSettings
    from model import GPT

    meta = load_meta(data_dir / "shakespeare_char")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=meta["vocab_size"])).eval()
    probe = Probe(meta, 32, ProbeSettings(probe_slots=4), 4, 1024, "cpu", lengths=[32, 64])
    (windows,) = eval_sets(data_dir / "shakespeare_char", meta, [64], 256, 128, "cpu").values()
    run = runtime.Runtime("cpu", torch.float32, False)
    with ReducedPrecisionMatmuls() as guard:
        probe.counts(model, 64, run)  # forked: a RoPE model takes a KV cache
        probe.hits(model, 64, run, whole=True)
        probe.by_slot(model, 32, run)
        context_value(model, windows, 32, run)
    assert not guard.seen, "reduced-precision matmuls in float32 scoring:\n" + "\n".join(guard.seen[:5])


def test_bfloat16_on_a_gpu_without_it_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(
        ValueError, match=r"dtype=bfloat16 is not supported by this GPU \(Tesla V100\); use dtype=float16"
    ):
        runtime.pick_dtype("bfloat16", "cuda")
    assert runtime.pick_dtype("float16", "cuda") == torch.float16


# Every scheme, and RoPE under every scaling, in each precision: the smallest model that still has two heads, so a
# scheme's bias or table passes through every op it takes in training, checkpointing, resuming and sampling.
SCALED = [f"--rope_scaling={name}" for name in scalings.SCALINGS if name != scalings.NO_SCALING]
QUICKSTART_RECIPE = ["--optimizer=muon", "--muon_split_qkv=true", "--qk_norm=true"]  # auto runs it in bf16 there
PRECISION_RUNS = (
    [[f"--pos_emb={name}"] for name in all_schemes()]
    + [["--pos_emb=rope", scaling, "--rope_scaling_factor=2"] for scaling in SCALED]
    + [QUICKSTART_RECIPE]
)
SMALLEST = ["--n_layer=1", "--n_embd=16", "--block_size=16", "--batch_size=2", "--eval_iters=1", "--eval_interval=1"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("setting", PRECISION_RUNS, ids=lambda setting: " ".join(setting))
def test_every_scheme_and_scaling_trains_resumes_and_samples_in_each_precision(data_dir, tmp_path, setting, dtype):
    out = tmp_path / "run"
    run = flags(data_dir, out, *SMALLEST, f"--dtype={dtype}", *setting)
    train.main([*run, "--max_iters=1"])
    train.main([*run, "--max_iters=2", "--resume=true"])
    assert load_checkpoint(out / "ckpt.pt")["record"]["dtype"] == dtype
    sample.main([f"--out_dir={out}", "--start=a", "--max_new_tokens=2", "--seed=1"])


def test_a_run_records_the_dtype_auto_resolved_to_and_a_resume_keeps_it(data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    run = flags(data_dir, out, *SMALLEST)
    monkeypatch.setattr(runtime, "cpu_prefers_bf16", lambda: True)  # a CPU where auto gives bf16
    train.main([*run, "--dtype=auto", "--max_iters=1"])
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    monkeypatch.setattr(runtime, "cpu_prefers_bf16", lambda: False)  # auto would now give float32: the run keeps bf16
    train.main([*run, "--dtype=auto", "--max_iters=2", "--resume=true"])
    assert load_checkpoint(out / "ckpt.pt")["record"]["dtype"] == "bfloat16"
    assert "at iteration 1, in bfloat16" in capsys.readouterr().out
    (out / "config.json").unlink()  # the checkpoint's own record refuses another dtype too
    with pytest.raises(SystemExit) as stop:
        train.main([*run, "--dtype=float32", "--max_iters=3", "--resume=true"])
    assert stop.value.code != 0
    message = "cannot resume: the run trains in dtype=bfloat16, and this command asks for dtype=float32"
    assert message in capsys.readouterr().err
