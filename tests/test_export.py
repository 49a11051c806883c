"""export.py and hf.py's way out: tiny checkpoints through transformers (no custom code, no network) give our
logits, our greedy tokens and our token ids; every shipped config's model exports; what transformers cannot run
is refused with one line."""

from pathlib import Path

import pytest
import tiktoken
import torch

import checkpoint
import config
import data.tokenizer
import export
from conftest import ROOT, all_logits, run, tiny_model
from data.bpe import train_bpe
from data.tokenizer import GPT2_PATTERN, bpe_encoding, ranks_to_text, tokenizer_from_meta
from generate import GREEDY, generate
from model import GPTConfig, all_schemes
from source import load_source
from train import TrainConfig

transformers = pytest.importorskip("transformers")  # the test extra has it; conftest keeps it offline

CHARS = sorted("\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
CHAR_META = {"tokenizer": "char", "chars": CHARS, "start_id": 0}
TOLERANCE = 1e-4  # float32
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only contends


def save_run(out, pos_emb, meta=CHAR_META, noise=0.1, **kw):
    """A run folder holding ckpt.pt of a tiny model whose every weight, bias and norm is moved off its init by
    noise (so a misplaced one shows in the logits); returns the model."""
    if meta["tokenizer"] == "char":
        kw["vocab_size"] = len(meta["chars"])
    model = tiny_model(pos_emb, **{"block_size": 32} | kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=noise)
    out.mkdir()
    checkpoint.save_checkpoint(
        {"model": model.state_dict(), "model_config": model.config.asdict(), "tokenizer": meta}, out / "ckpt.pt"
    )
    return model


def exported(tmp_path, pos_emb, *flags, meta=CHAR_META, noise=0.1, **kw):
    """(our model, the transformers model export.py wrote, loaded by the Auto class, the folder)."""
    model = save_run(tmp_path / "out", pos_emb, meta, noise, **kw)
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}", *flags])
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # no trust_remote_code
    return model, hf.eval(), tmp_path / "hf"


@torch.inference_mode()
def max_difference(model, hf, n):
    idx = torch.randint(0, model.config.vocab_size, (2, n), generator=torch.Generator().manual_seed(1))
    return (all_logits(model, idx) - hf(idx).logits).abs().max().item()


# ----------------------------------------------------------------------------- the models

CASES = {  # name: (pos_emb, config, the transformers class)
    "rope-interleaved": ("rope", {}, "GPTNeoXForCausalLM"),
    "rope-half": ("rope", {"rope_layout": "half"}, "GPTNeoXForCausalLM"),
    "rope-interleaved-partial-bias": ("rope", {"rope_fraction": 0.5, "bias": True}, "GPTNeoXForCausalLM"),
    "rope-half-partial": (
        "rope",
        {"rope_layout": "half", "rope_fraction": 0.25, "rope_base": 500.0},
        "GPTNeoXForCausalLM",
    ),
    "none": ("none", {}, "GPTNeoXForCausalLM"),
    "learned": ("learned", {}, "GPT2LMHeadModel"),
    "learned-bias": ("learned", {"bias": True}, "GPT2LMHeadModel"),
    "rope-untied-relu2": ("rope", {"tie_embeddings": False, "mlp_act": "relu2"}, "GPTNeoXForCausalLM"),
    "learned-untied": ("learned", {"tie_embeddings": False}, "GPT2LMHeadModel"),
    "learned-gelu-tanh": ("learned", {"mlp_act": "gelu_tanh"}, "GPT2LMHeadModel"),
    "rope-parallel-gelu-tanh": (
        "rope",
        {"parallel_residual": True, "mlp_act": "gelu_tanh", "rope_layout": "half"},
        "GPTNeoXForCausalLM",
    ),
    "rope-qk-norm": ("rope", {"qk_norm": True}, "PersimmonForCausalLM"),
    "rope-qk-norm-partial-bias": (
        "rope",
        {"qk_norm": True, "rope_fraction": 0.5, "bias": True, "mlp_act": "relu2"},
        "PersimmonForCausalLM",
    ),
    "none-qk-norm-untied": ("none", {"qk_norm": True, "tie_embeddings": False}, "PersimmonForCausalLM"),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_agree_through_transformers(tmp_path, case):
    pos_emb, kw, cls = CASES[case]
    model, hf, _ = exported(tmp_path, pos_emb, **kw)
    assert type(hf).__name__ == cls
    tied = hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    assert hf.config.tie_word_embeddings == tied == model.config.tie_embeddings
    n = 32 if pos_emb == "learned" else 48  # rotary and NoPE reach past block_size=32, as in transformers
    assert max_difference(model, hf, n) < TOLERANCE


SHIPPED = sorted(
    p.name for p in (ROOT / "configs").glob("*.toml") if not p.name.startswith(("ablate", "extend", "recipe"))
)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_configs_model_exports(tmp_path, name):
    """The model each config trains (its options: qk_norm, mlp_act, positions, ...), shrunk to a tiny shape."""
    model_cfg, _ = config.parse([str(ROOT / "configs" / name)], GPTConfig, TrainConfig)
    options = {
        k: v
        for k, v in model_cfg.asdict().items()
        if v != getattr(GPTConfig(), k)
        and k not in ("n_layer", "n_head", "n_embd", "block_size", "original_len", "vocab_size", "dropout")
    }
    model, hf_model, _ = exported(tmp_path, model_cfg.pos_emb, **{k: v for k, v in options.items() if k != "pos_emb"})
    assert max_difference(model, hf_model, 32) < TOLERANCE


@pytest.mark.parametrize(
    "pos_emb, kw", [("rope", {"rope_fraction": 0.5}), ("learned", {"bias": True}), ("rope", {"qk_norm": True})]
)
def test_greedy_generation_is_ours_token_for_token(tmp_path, pos_emb, kw):
    # random weights loop on a token or two; larger ones loop later, so more of the text is a test
    model, hf, folder = exported(tmp_path, pos_emb, block_size=64, noise=0.5, **kw)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = "ROMEO:\nBut soft, what light"
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids.tolist() == [tokenizer_from_meta(CHAR_META).encode(prompt)]
    # the text and three random prompts of its length, continued within block_size (our window never slides)
    ids = torch.cat((ids, torch.randint(0, len(CHARS), (3, ids.shape[1]), generator=torch.Generator().manual_seed(0))))
    new = 64 - ids.shape[1]
    ours = torch.cat(list(generate(model, ids, new, GREEDY)), dim=1)  # (4, new)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
    assert torch.equal(theirs[:, ids.shape[1] :], ours)
    assert len(ours.unique()) > 6, "degenerate greedy text would prove little"


SCALINGS = {  # name: how the scaling is set (in the checkpoint, or by export's flags), transformers' rope_type
    "linear": ({"rope_scaling": "linear", "rope_scaling_factor": 2.0}, [], "linear"),
    "ntk": ({}, ["--rope_scaling=ntk", "--rope_scaling_factor=4"], "default"),  # as a larger rope_theta
    "dynamic": ({}, ["--rope_scaling=dynamic", "--rope_scaling_factor=4"], "dynamic"),
    "llama3": ({"rope_layout": "half"}, ["--rope_scaling=llama3", "--rope_scaling_factor=4"], "llama3"),
    "yarn": ({"rope_fraction": 1.0}, ["--rope_scaling=yarn", "--rope_scaling_factor=4"], "yarn"),  # and temperature
    # fine-tuned at 32 tokens from L0 = 16 (extend.py): transformers' original_max_position_embeddings is L0
    "yarn-finetuned": (
        {"rope_fraction": 1.0, "rope_scaling": "yarn", "rope_scaling_factor": 2.0, "original_len": 16},
        [],
        "yarn",
    ),
    "dynamic-finetuned": ({"rope_scaling": "dynamic", "rope_scaling_factor": 2.0, "original_len": 16}, [], "dynamic"),
}


@pytest.mark.parametrize("scaling", SCALINGS)
def test_rope_scalings_run_as_transformers_own_past_block_size(tmp_path, scaling):
    kw, flags, rope_type = SCALINGS[scaling]
    model, hf, _ = exported(tmp_path, "rope", *flags, **({"rope_fraction": 0.5} | kw))
    assert hf.config.rope_parameters["rope_type"] == rope_type
    if flags:  # the flags set the same scaling on our model as a checkpoint's config would
        model.reconfigure(rope_scaling=flags[0].partition("=")[2], rope_scaling_factor=4.0)
    assert max_difference(model, hf, 96) < TOLERANCE  # 3 x block_size: dynamic's frequencies move with the length


@pytest.mark.parametrize("scaling", SCALINGS)
def test_an_exported_scaling_imports_back_to_the_same_frequencies_and_logits(tmp_path, scaling):
    kw, flags, _ = SCALINGS[scaling]
    model, _, folder = exported(tmp_path, "rope", *flags, **({"rope_fraction": 0.5, "bias": True} | kw))
    if flags:
        model.reconfigure(rope_scaling=flags[0].partition("=")[2], rope_scaling_factor=4.0)
    back = load_source(f"hf:{folder}", "init_from").model().eval()
    assert torch.equal(back.scheme.inv_freq, model.scheme.inv_freq)  # bit for bit: ntk as its larger base
    assert back.scheme.attn_factor == model.scheme.attn_factor
    idx = torch.randint(0, model.config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    assert (all_logits(back, idx) - all_logits(model, idx)).abs().max().item() < TOLERANCE


# ----------------------------------------------------------------------------- tokenizers


def test_char_tokenizer_gives_our_ids_and_text_back(tmp_path, corpus):
    text = corpus.read_text()[:20000]
    meta = {"tokenizer": "char", "chars": sorted(set(text)), "start_id": 0}
    *_, folder = exported(tmp_path, "rope", meta=meta)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(text).input_ids
    assert ids == tokenizer_from_meta(meta).encode(text)
    assert tok.decode(ids) == text
    with pytest.raises(Exception, match="Missing"):  # as ours, a character outside the vocabulary is an error
        tok("café")


def test_bpe_tokenizer_encodes_as_tiktoken_does(tmp_path, corpus):
    text = corpus.read_text()
    ranks, _ = train_bpe(text[:200_000], 512, progress=False)
    meta = {"tokenizer": "bpe", "bpe_ranks": ranks_to_text(ranks), "bpe_pattern": GPT2_PATTERN, "start_id": 10}
    *_, folder = exported(tmp_path, "rope", meta=meta, vocab_size=512)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ours = tokenizer_from_meta(meta)
    for sample in (text[-30_000:], "naïve café — 😀 12345 it's\r\n\n\t  x <|endoftext|>"):
        ids = tok(sample).input_ids
        assert ids == ours.encode(sample)
        assert tok.decode(ids) == sample


def test_gpt2_tokenizer_keeps_its_end_of_text_token(tmp_path, corpus, monkeypatch):
    """tiktoken's GPT-2 files are not here offline: a small encoding of the same shape (byte-level ranks, the
    GPT-2 pattern, <|endoftext|> as the last id) stands in for it."""
    ranks, _ = train_bpe(corpus.read_text()[:100_000], 300, progress=False)
    stand_in = tiktoken.Encoding(
        "gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 300}
    )
    monkeypatch.setattr(data.tokenizer, "gpt2_encoding", lambda: stand_in)
    meta = {"tokenizer": "gpt2", "eot": 300, "start_id": 300}
    _, hf, folder = exported(tmp_path, "learned", meta=meta, vocab_size=301)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", 300)
    assert hf.config.eos_token_id == hf.generation_config.eos_token_id == 300
    text = "ROMEO:\nBut soft, what light through yonder window breaks?"
    assert tok(text).input_ids == bpe_encoding(ranks).encode_ordinary(text)


# ----------------------------------------------------------------------------- refusals

REFUSED = {  # name: (pos_emb, config, the arguments after OUT_DIR, the error's gist)
    **{
        s: (s, {}, ["hf"], f"pos_emb='{s}' has no transformers architecture")
        for s, cls in all_schemes().items()
        if cls.transformers()[0] is None
    },
    "p-rope": ("rope", {"rope_p": 0.5}, ["hf"], "rope_p=0.5 < 1"),
    "qk-norm-learned": ("learned", {"qk_norm": True}, ["hf"], "only Persimmon normalises queries and keys"),
    "qk-norm-parallel": ("rope", {"qk_norm": True, "parallel_residual": True}, ["hf"], "sequential residual"),
    "parallel-learned": ("learned", {"parallel_residual": True}, ["hf"], "GPT-2's residual is sequential"),
    "logit-softcap": ("learned", {"logit_softcap": 30.0}, ["hf"], "logit_softcap=30.0: GPT-NeoX, Persimmon and"),
    "partial-yarn": (
        "rope",
        {"rope_fraction": 0.5},
        ["hf", "--rope_scaling=yarn", "--rope_scaling_factor=4"],
        "temperature on the rotated dims alone",
    ),
    "scaling-without-factor": ("rope", {}, ["hf", "--rope_scaling=linear"], "needs its factor"),
    "scaling-of-learned": (
        "learned",
        {},
        ["hf", "--rope_scaling=linear", "--rope_scaling_factor=2"],
        "rope_scaling='linear' does nothing for pos_emb='learned'",
    ),
    "into-the-run": ("rope", {}, ["out"], "training run's folder"),  # would overwrite the run's config.json
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_transformers_cannot_run_is_refused_in_one_line(tmp_path, capsys, case):
    pos_emb, kw, args, gist = REFUSED[case]
    save_run(tmp_path / "out", pos_emb, **kw)
    with pytest.raises(SystemExit) as exit_:
        export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / args[0]}", *args[1:]])
    out, err = capsys.readouterr()
    assert exit_.value.code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and gist in err, err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "out" / "config.json").exists()


def test_the_export_says_what_it_wrote(tmp_path, capsys):
    save_run(tmp_path / "out", "rope", rope_layout="half")
    export.main([f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}"])
    assert "as GPTNeoXForCausalLM (rope; tokenizer char): logits agree with nanorope's to" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_without_out_dir_the_newest_run_here_is_exported_as_sample_reads_it(tmp_path, capsys, monkeypatch):
    save_run(tmp_path / "out-rope", "rope")
    monkeypatch.chdir(tmp_path)
    export.main(["--hf_dir=hf"])
    assert capsys.readouterr().out.startswith(f"{Path('out-rope') / 'ckpt.pt'} -> hf/ as GPTNeoXForCausalLM (rope;")


def test_the_command_refuses_with_exit_1(tmp_path):
    save_run(tmp_path / "out", "alibi")
    proc = run("export.py", f"--out_dir={tmp_path / 'out'}", f"--hf_dir={tmp_path / 'hf'}", check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
