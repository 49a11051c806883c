"""runtime.py: the automatic device and dtype choices."""

import pytest
import torch

import runtime


@pytest.mark.parametrize("caps, seconds, expected", [
    ({"avx512_bf16": True, "amx_bf16": False}, {torch.float32: 1.0, torch.bfloat16: 0.4}, torch.bfloat16),
    ({"avx512_bf16": False, "amx_bf16": True}, {torch.float32: 1.0, torch.bfloat16: 0.4}, torch.bfloat16),
    ({"avx512_bf16": True, "amx_bf16": False}, {torch.float32: 1.0, torch.bfloat16: 1.7}, torch.float32),  # slow bf16
    ({"avx512_bf16": True, "amx_bf16": False}, {torch.float32: 1.0, torch.bfloat16: 0.8}, torch.float32),  # near parity
    ({"avx512_bf16": False, "amx_bf16": False, "avx2": True}, {}, torch.float32),  # emulated: no probe
])
def test_auto_dtype_on_cpu_is_bfloat16_only_where_its_matmuls_are_clearly_faster(monkeypatch, caps, seconds, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(runtime, "matmul_seconds", lambda dtype: seconds[dtype])
    runtime.cpu_bf16_is_faster.cache_clear()
    try:
        assert runtime.pick_dtype("auto", "cpu") == expected
    finally:
        runtime.cpu_bf16_is_faster.cache_clear()  # the real CPU's answer for the tests after
    assert runtime.pick_dtype("float32", "cpu") == torch.float32  # an explicit choice is kept
    assert runtime.pick_dtype("auto", "mps") == torch.float32


def test_the_matmul_probe_times_each_dtype():
    assert 0 < runtime.matmul_seconds(torch.float32, n=64, repeats=2) < 1
    assert 0 < runtime.matmul_seconds(torch.bfloat16, n=64, repeats=2) < 1


@pytest.mark.parametrize("another_rank_chose_float32, expected", [(True, torch.float32), (False, torch.bfloat16)])
def test_under_torchrun_auto_cpu_dtype_is_bfloat16_only_if_every_process_chose_it(monkeypatch,
                                                                                  another_rank_chose_float32, expected):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(runtime, "cpu_bf16_is_faster", lambda: True)  # this process's probe
    monkeypatch.setattr(runtime.dist, "init_process_group", lambda backend: None)
    monkeypatch.setattr(runtime, "any_rank", lambda flag, rt: flag or another_rank_chose_float32)
    assert runtime.setup_runtime("cpu", "auto", quiet=True).dtype == expected
    assert runtime.setup_runtime("cpu", "bfloat16", quiet=True).dtype == torch.bfloat16  # an explicit choice is kept


def test_decoding_autocasts_on_cuda_only_and_picks_no_dtype_elsewhere(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_bf16_is_faster", lambda: pytest.fail("the CPU's probe ran for decoding"))
    with runtime.decode_autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with runtime.decode_autocast("cpu", torch.bfloat16):  # a training run's dtype: still off for decoding on CPU
        assert not torch.is_autocast_enabled("cpu")
