"""checkpoint.py: atomic writes, weights_only loading that never runs code, RNG state, models from files."""

import pickle
import random
import re

import numpy as np
import pytest
import torch

import checkpoint
import positions
from conftest import ROOT, Payload, all_logits
from conftest import tiny_model as tiny


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    checkpoint.save_checkpoint({"rng": checkpoint.rng_state()}, tmp_path / "r.pt")
    expected = random.random(), np.random.rand(), torch.rand(3)
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    checkpoint.set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    got = random.random(), np.random.rand(), torch.rand(3)
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


REFUSED = r"refused to load .*: it asks to call \S*open, not just to hold tensors and plain data"


@pytest.mark.parametrize("protocol, message", [
    ("torch.save", REFUSED),
    (2, REFUSED),  # a bare pickle, as torch's legacy format
    (4, r"is not a readable checkpoint, it is truncated or corrupt \(UnpicklingError: Unsupported operand"),
])
def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(tmp_path, protocol, message):
    marker, path = tmp_path / "pwned", tmp_path / "ckpt.pt"
    evil = {"model": Payload(marker), "model_config": {}}
    if protocol == "torch.save":
        torch.save(evil, path)
    else:
        path.write_bytes(pickle.dumps(evil, protocol=protocol))
    with pytest.raises(ValueError, match=message):
        checkpoint.load_checkpoint(path)
    assert not marker.exists()
    if protocol == "torch.save":
        torch.load(path, weights_only=False)  # control: a full unpickler does run it
    else:
        pickle.loads(path.read_bytes())
    assert marker.exists()


def test_every_torch_load_in_the_repo_is_weights_only():
    calls = [(p.name, m[0]) for p in [*ROOT.glob("*.py"), *ROOT.glob("data/*.py")]
             for m in re.finditer(r"torch\.load\([^)]*\)", p.read_text())]
    assert calls and all("weights_only=True" in call for _, call in calls), calls


@pytest.mark.parametrize("pos_emb", positions.SCHEMES)
def test_a_saved_model_loads_back_to_the_same_logits(pos_emb, tmp_path):
    model = tiny(pos_emb)
    for p in model.parameters():  # away from init, so a parameter that failed to load would show
        p.data.add_(torch.randn_like(p), alpha=0.1)
    checkpoint.save_checkpoint({"model": model.state_dict(), "model_config": model.config.asdict()}, tmp_path / "m.pt")
    loaded = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(tmp_path / "m.pt")).eval()
    idx = torch.randint(0, 11, (2, 16))
    assert torch.equal(all_logits(loaded, idx), all_logits(model, idx))
