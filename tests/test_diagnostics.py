"""lab/diagnostics.py: the recorded attention is scaled_dot_product_attention's, and its statistics match a
pattern worked out by hand."""

import math

import pytest
import torch

import model as model_module
from conftest import tiny_model
from lab import diagnostics
from runtime import Runtime


@pytest.mark.parametrize("kind", ["causal", "bool", "float"])
def test_the_weights_are_those_sdpa_applies(kind):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = {"causal": None, "bool": torch.rand(5, 5, generator=g) > 0.3, "float": torch.randn(3, 5, 5, generator=g)}[
        kind
    ]
    if kind == "bool":
        mask[:, 0] = True  # every query sees a key
    p = diagnostics.weights(q, k, mask, kind == "causal", 0.3)
    torch.testing.assert_close(p @ v, model_module.attention(q, k, v, mask, is_causal=kind == "causal", scale=0.3))


class Windows:
    block_size = 8

    def eval_batches(self, split):
        yield torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1)), None


def test_uniform_causal_attention_has_the_distance_and_entropy_of_its_formula():
    model = tiny_model("none")
    for block in model.blocks:  # queries and keys all zero: every head spreads evenly over the keys it sees
        torch.nn.init.zeros_(block.attn.c_attn.weight)
    stats = diagnostics.attention_stats(model, Windows(), Runtime("cpu", torch.float32, False))
    distance = sum(i / 2 for i in range(8)) / 8  # query i: the mean of 0..i
    entropy = sum(math.log(i + 1) for i in range(8)) / 8
    torch.testing.assert_close(torch.tensor(stats["distance"]), torch.full((2, 2), distance))
    torch.testing.assert_close(torch.tensor(stats["entropy"]), torch.full((2, 2), entropy))


def test_bias_curves_are_the_schemes_biases_by_distance():
    alibi = tiny_model("alibi", n_head=2)
    curves = diagnostics.bias_curves(alibi, 6)
    expected = torch.tensor([[-d / 16 for d in range(6)], [-d / 256 for d in range(6)]])  # slopes 2^-4, 2^-8
    torch.testing.assert_close(torch.tensor(curves[0]), expected)
    assert diagnostics.bias_curves(tiny_model("rope"), 6) is None
