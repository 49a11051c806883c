"""lab/report.py: the regime table's ratios, LLaMA-2-7B's row computed from its published config."""

import math

import pytest

from lab.report import LLAMA2, regime, regime_rows

# meta-llama/Llama-2-7b-hf's config.json: hidden_size 4096, num_attention_heads 32, max_position_embeddings 4096;
# RoPE's theta 10,000 (Meta's code's default; transformers' too)
PUBLISHED = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0}


def test_llama2s_row_follows_from_its_published_config():
    d = PUBLISHED["hidden_size"] // PUBLISHED["num_attention_heads"]
    base, L0 = PUBLISHED["rope_theta"], PUBLISHED["max_position_embeddings"]
    assert (LLAMA2["head_dim"], LLAMA2["base"], LLAMA2["L0"]) == (d, base, L0)
    row = regime_rows([])[-1]
    assert (
        row["longest_over_L0"]
        == pytest.approx(2 * math.pi * base ** (1 - 2 / d) / L0)
        == pytest.approx(13.28, abs=0.01)
    )
    assert row["fastest_turns"] == pytest.approx(L0 / (2 * math.pi)) == pytest.approx(651.9, abs=0.1)
    # YaRN's bands, from the pair whose theta_i turns beta times within L0: i = d ln(L0 / (2 pi beta)) / (2 ln base)
    low = math.floor(d * math.log(L0 / (2 * math.pi * 32)) / (2 * math.log(base)))  # 20: pairs 0..20 keep theta
    high = math.ceil(d * math.log(L0 / (2 * math.pi * 1)) / (2 * math.log(base)))  # 46: pairs 46.. get theta / s
    assert (low, high) == (20, 46)
    assert (row["yarn_kept"], row["yarn_ramped"], row["yarn_interpolated"]) == pytest.approx(
        ((low + 1) / 64, (high - low - 1) / 64, (64 - high) / 64)
    )  # about a third each


def test_a_small_model_matched_at_the_longest_wavelength_differs_at_the_fastest():
    small = regime("L0 = 64", 32, 200.0, 64)
    assert small["longest_over_L0"] == pytest.approx(14.1, abs=0.05) and small["fastest_turns"] == pytest.approx(
        10.2, abs=0.05
    )
    assert small["yarn_kept"] == 1 / 16 and small["yarn_interpolated"] >= 0.5  # only pair 0 kept; half interpolated
