"""checkpoint.py: atomic writes, weights_only loading that never runs code, RNG state, models from files."""

import pickle
import random
import re

import numpy as np
import pytest
import torch

import checkpoint
from conftest import ROOT, Payload, all_logits, tiny_model as tiny
from model import GPT, GPTConfig, all_schemes
from source import fine_tune_config, load_source


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


@pytest.mark.parametrize(
    "protocol, message",
    [
        ("torch.save", REFUSED),
        (2, REFUSED),  # a bare pickle, as torch's legacy format
        (4, r"is not a readable checkpoint, it is truncated or corrupt \(UnpicklingError: Unsupported operand"),
    ],
)
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
    calls = [
        (p.name, m[0])
        for p in [*ROOT.glob("*.py"), *ROOT.glob("data/*.py")]
        for m in re.finditer(r"torch\.load\([^)]*\)", p.read_text())
    ]
    assert calls and all("weights_only=True" in call for _, call in calls), calls


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_a_saved_model_loads_back_to_the_same_logits(pos_emb, tmp_path):
    model = tiny(pos_emb)
    for p in model.parameters():  # away from init, so a parameter that failed to load would show
        p.data.add_(torch.randn_like(p), alpha=0.1)
    checkpoint.save_checkpoint({"model": model.state_dict(), "model_config": model.config.asdict()}, tmp_path / "m.pt")
    loaded = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(tmp_path / "m.pt")).eval()
    idx = torch.randint(0, 11, (2, 16))
    assert torch.equal(all_logits(loaded, idx), all_logits(model, idx))


# ----------------------------------------------------------------------------- fine-tunes from a checkpoint

META = {"tokenizer": "char", "chars": list("abcdefghijk"), "start_id": 0, "dataset": "tiny"}


def saved_source(tmp_path, pos_emb, **kw):
    """load_source of a run folder holding a tiny model of block_size 32, moved off its init."""
    model = tiny(pos_emb, block_size=32, **kw)
    for p in model.parameters():
        p.data.add_(torch.randn_like(p), alpha=0.1)
    (tmp_path / "run").mkdir()
    checkpoint.save_checkpoint(
        {"model": model.state_dict(), "model_config": model.config.asdict(), "tokenizer": META},
        tmp_path / "run" / "ckpt.pt",
    )
    return load_source(str(tmp_path / "run"), "init_from")


@pytest.mark.parametrize("pos_emb", all_schemes())
def test_a_fine_tune_at_a_shorter_context_takes_every_weight_its_scheme_still_reads(pos_emb, tmp_path):
    source = saved_source(tmp_path, pos_emb)
    config = fine_tune_config(source, GPTConfig(block_size=16, pos_emb=pos_emb), META, "init_from=run")
    assert (config.block_size, config.L0) == (16, 16)
    tuned, trained = source.load_into(GPT(config)).state_dict(), source.model().state_dict()
    assert tuned.keys() == trained.keys()
    for name, t in tuned.items():  # a learned table's first 16 rows, every other weight as it was
        assert torch.equal(t, trained[name][:16] if name == "scheme.wpe.weight" else trained[name]), name


def test_a_typed_original_len_is_compared_with_the_sources_even_where_it_equals_its_default(tmp_path):
    source = saved_source(tmp_path, "rope")  # L0 = 32, by the default rule
    assert source.config.original_len is None and source.config.L0 == 32
    longer = fine_tune_config(source, GPTConfig(block_size=64), META, "init_from=run")
    assert longer.original_len == 32  # kept
    with pytest.raises(ValueError, match="^original_len=64 contradicts init_from=run, which learned L0 = 32"):
        fine_tune_config(source, GPTConfig(block_size=64, original_len=64), META, "init_from=run")
    typed = fine_tune_config(source, GPTConfig(block_size=64, original_len=32), META, "init_from=run")
    assert typed == longer


def test_a_renamed_setting_of_an_older_checkpoint_loads_under_its_name_now(tmp_path):
    model = tiny("rope", original_len=8)
    old = model.config.asdict()
    old["rope_original_len"] = old.pop("original_len")
    checkpoint.save_checkpoint({"model": model.state_dict(), "model_config": old}, tmp_path / "old.pt")
    assert checkpoint.load_checkpoint(tmp_path / "old.pt")["model_config"]["original_len"] == 8


def test_an_older_checkpoint_with_the_schemes_parameters_under_pos_loads(tmp_path):
    model = tiny("learned")
    for p in model.parameters():
        p.data.add_(torch.randn_like(p), alpha=0.1)
    old = {k.replace("scheme.", "pos.", 1): v for k, v in model.state_dict().items()}
    assert "pos.wpe.weight" in old
    checkpoint.save_checkpoint({"model": old, "model_config": model.config.asdict()}, tmp_path / "old.pt")
    loaded = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(tmp_path / "old.pt")).eval()
    idx = torch.randint(0, 11, (2, 16))
    assert torch.equal(all_logits(loaded, idx), all_logits(model, idx))
