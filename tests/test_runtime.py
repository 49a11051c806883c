"""runtime.py: the automatic device and dtype choices."""

import pytest
import torch

import runtime


@pytest.mark.parametrize("caps, expected", [
    ({"avx512_bf16": True, "amx_bf16": False}, torch.bfloat16),
    ({"avx512_bf16": False, "amx_bf16": True}, torch.bfloat16),
    ({"avx512_bf16": False, "amx_bf16": False, "avx2": True}, torch.float32),  # bf16 would be emulated
])
def test_auto_dtype_on_cpu_is_bfloat16_only_where_the_cpu_multiplies_it_natively(monkeypatch, caps, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert runtime.pick_dtype("auto", "cpu") == expected
    assert runtime.pick_dtype("float32", "cpu") == torch.float32  # an explicit choice is kept
    assert runtime.pick_dtype("auto", "mps") == torch.float32
