"""positions.py: the registry's contract, and the non-RoPE schemes' maths against their papers' formulas.
The generic behaviour of every registered scheme (causality, shifts, cache exactness) is tested in
test_model.py and test_generate.py, parametrized over positions.SCHEMES."""

import math

import pytest
import torch

import positions
from conftest import tiny_model as tiny


def test_sinusoidal_table_matches_its_formula():
    pe = positions.sinusoidal_table(100, 16, base=10000.0)
    assert pe.shape == (100, 16) and pe.dtype == torch.float32
    for p in (0, 1, 37, 99):
        for i in range(8):
            w = 10000.0 ** (2 * i / 16)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p / w), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p / w), abs=1e-6)
    with pytest.raises(ValueError, match="d=15"):
        positions.sinusoidal_table(10, 15)



def test_alibi_slopes_follow_the_papers_rule():
    assert positions.alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    # 12 heads: the 8-head sequence 2^(-8h/8), then h = 1, 3, 5, 7 of the 16-head one 2^(-8h/16)
    expected = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    torch.testing.assert_close(positions.alibi_slopes(12), torch.tensor(expected), rtol=1e-7, atol=0)
    torch.testing.assert_close(positions.alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)]))
    assert positions.alibi_slopes(1).tolist() == [2.0 ** -8]
    with pytest.raises(ValueError, match="n_head=0"):
        positions.alibi_slopes(0)



def test_alibi_bias_values_mask_and_offset():
    slopes = positions.alibi_slopes(4)  # 1/4, 1/16, 1/64, 1/256
    b = positions.alibi_bias(slopes, q_len=3, k_len=5, offset=2)  # queries at positions 2, 3, 4
    assert b.shape == (4, 3, 5) and b.dtype == torch.float32
    assert b[0, 0, 0].item() == -0.5 and b[0, 0, 2].item() == 0.0 and b[1, 2, 1].item() == -3 / 16
    assert b[0, 0, 3].item() == -math.inf and b[3, 1, 4].item() == -math.inf and b[2, 2, 4].item() == 0.0
    square = positions.alibi_bias(slopes, 6, 6)
    assert torch.equal(torch.isinf(square[1]), torch.ones(6, 6).triu(1).bool())
    # one new token with a KV cache of 5 sees the last row of the full square
    torch.testing.assert_close(positions.alibi_bias(slopes, 1, 6, offset=5), square[:, 5:])


def test_sinusoidal_input_is_scaled_tokens_plus_the_table():
    # the paper scales token embeddings by sqrt(d) before adding the table; without it the +-1 table
    # drowns std-0.02 embeddings and the scheme cannot learn in a short run
    model = tiny("sinusoidal")
    tok = torch.randn(2, 5, 32)
    expected = tok * math.sqrt(32) + positions.sinusoidal_table(8, 32)[3:8]
    torch.testing.assert_close(model.pos.embed(tok, 3), expected)
    far = model.pos.embed(tok, 40)  # past the built table: computed from the formula on demand
    torch.testing.assert_close(far, tok * math.sqrt(32) + positions.sinusoidal_table(45, 32)[40:45])
