"""lab/grid.py: the parsing of grid entries, the fixed evaluation sets and the per-position losses."""

import pytest
import torch

from data.tokenizer import load_meta
from lab import ablate, grid
from model import GPT, GPTConfig
from runtime import Runtime

KEYS = (grid.field_types(GPTConfig, ("rope_base", "rope_fraction", "rope_layout"))
        | grid.field_types(ablate.DroPE, ("drop_rope_at",)),)


def test_changes_parse_into_typed_overrides():
    assert grid.parse_changes(" b500: rope_base=500 ; half:rope_fraction=0.5, rope_layout=half", *KEYS) == [
        ("b500", {"rope_base": 500.0}), ("half", {"rope_fraction": 0.5, "rope_layout": "half"})]
    assert grid.parse_changes("drope: drop_rope_at=800", *KEYS) == [("drope", {"drop_rope_at": 800})]
    with pytest.raises(ValueError, match="rope_base"):
        grid.parse_changes("b: rope_base=ten", *KEYS)
    with pytest.raises(ValueError, match="^recipe 'rope_base=500' should look like 'name: key=value"):
        grid.parse_changes("rope_base=500", *KEYS, what="recipe")
    with pytest.raises(ValueError, match="key=value, the key one of rope_base"):
        grid.parse_changes("b: n_layer=3", *KEYS)


def test_numbers_are_sorted_distinct_and_bounded():
    assert grid.numbers("factors", "4, 2,2", float, 1.0, "2,4") == [2.0, 4.0]
    with pytest.raises(ValueError, match=r"factors='0.5' must list numbers >= 1.0, e.g. 2,4"):
        grid.numbers("factors", "0.5", float, 1.0, "2,4")


def test_position_losses_match_the_model_loss_on_each_prefix(data_dir):
    # the loss at position p is the model's mean loss on prefixes of length p+1, times p+1, minus that of length p:
    # an independent route (causality + the model's own loss) to check the per-position bookkeeping
    meta = load_meta(data_dir / "shakespeare_char")
    (batches,) = grid.eval_sets(data_dir / "shakespeare_char", meta, [12], 48, 24, "cpu").values()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=meta["vocab_size"])).eval()
    rt = Runtime("cpu", torch.float32, False)
    curve = grid.position_losses(model, batches, rt)
    x, y = map(torch.cat, zip(*batches.eval_batches("val")))  # (4, 12) each: 48 tokens, 2 windows per forward
    assert len(x) == 4
    with torch.no_grad():
        prefix = [0.0] + [model(x[:, :p], y[:, :p])[1].item() * p for p in range(1, 13)]
    torch.testing.assert_close(curve, torch.tensor(prefix).diff().double(), atol=1e-5, rtol=1e-5)
    # the same windows for every model and every call: drawn from the evaluation seed alone
    (again,) = grid.eval_sets(data_dir / "shakespeare_char", meta, [12], 48, 24, "cpu").values()
    assert torch.equal(again.eval_starts["val"], batches.eval_starts["val"])
