"""hf.py's way in: tiny random GPT-2 and GPT-NeoX checkpoints saved by transformers (no download) import with
their logits, fine-tune through train.py --init_from=hf:PATH with their own tokenizer, resume and sample; what
cannot map is one line and nothing written."""

import json
import shutil
import time

import pytest
import torch

import hf
import sample
import train
from conftest import TINY
from data import prepare
from source import load_source

transformers = pytest.importorskip("transformers")  # the test extra has it; conftest keeps it offline
constants = pytest.importorskip("huggingface_hub.constants")  # installed with transformers

TOLERANCE = 1e-4  # float32
EOT = "<|endoftext|>"
pytestmark = pytest.mark.usefixtures("one_thread")


def char_tokenizer(corpus):
    """A fast tokenizer of single characters (tiny Shakespeare's) and an end-of-text token, as transformers saves."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(set(corpus.read_text()))
    backend = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars + [EOT])}, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([EOT])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT, bos_token=EOT)


CONFIGS = {  # a tiny model of each family, options as their real checkpoints have them
    "gpt2": lambda v: transformers.GPT2Config(
        vocab_size=v,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "pythia": lambda v: transformers.GPTNeoXConfig(  # Pythia: parallel residual, a quarter of the dims rotated,
        vocab_size=v + 14,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_act="gelu",
        use_parallel_residual=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        attention_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    ),  # and a vocabulary padded past the tokenizer's
}


def saved(family, folder, corpus):
    """A folder holding a tiny random model of one family, every weight moved off its init, and its tokenizer."""
    tok = char_tokenizer(corpus)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](len(tok)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model.eval()


@pytest.fixture(params=CONFIGS)
def checkpoint(request, tmp_path_factory, corpus):
    return saved(request.param, tmp_path_factory.mktemp(request.param), corpus)


@torch.inference_mode()
def test_imported_logits_are_the_checkpoints(checkpoint):
    folder, theirs = checkpoint
    ours = load_source(f"hf:{folder}", "init_from").model().eval()
    idx = torch.randint(0, 60, (2, 64), generator=torch.Generator().manual_seed(1))
    assert (ours(idx, targets=idx)[0] - theirs(idx).logits).abs().max().item() < TOLERANCE
    c = ours.config
    assert (c.pos_emb, c.mlp_act) == (
        ("learned", "gelu_tanh") if theirs.config.model_type == "gpt2" else ("rope", "gelu")
    )


@torch.inference_mode()
def test_an_imported_model_exports_back_to_its_architecture(checkpoint):
    folder, theirs = checkpoint
    ours = load_source(f"hf:{folder}", "init_from").model().eval()
    again = hf.exported(ours, {"start_id": 0, "eot": None})
    assert type(again) is type(theirs)
    idx = torch.randint(0, 60, (1, 48), generator=torch.Generator().manual_seed(2))
    assert (again(idx).logits - theirs(idx).logits).abs().max().item() < TOLERANCE


def test_fine_tune_from_a_checkpoint_resume_and_sample(checkpoint, corpus, tmp_path, capsys):
    folder, theirs = checkpoint  # in-process: each command in a subprocess spent ~4 s importing transformers
    data = tmp_path / "data"
    assert (
        prepare.main(
            ["--input", str(corpus), "--data_dir", str(data), "--dataset", "tiny", "--tokenizer", f"hf:{folder}"]
        )
        == 0
    )
    assert json.loads((data / "tiny" / "meta.json").read_text())["tokenizer"] == "hf"
    out = tmp_path / "run"
    args = [
        *TINY,
        f"--data_dir={data}",
        "--dataset=tiny",
        f"--out_dir={out}",
        f"--init_from=hf:{folder}",
        "--eval_interval=2",
        "--learning_rate=1e-3",
    ]
    train.main([*args, "--max_iters=4"])
    # the checkpoint's weights moved by 4 steps of at most ~lr each, not a fresh model's (std 0.02, noise 0.1 apart)
    embedding = torch.load(out / "ckpt.pt", weights_only=True)["model"]["wte.weight"]
    assert (embedding - theirs.get_input_embeddings().weight).abs().max() < 0.01
    train.main([*args, "--max_iters=6", "--resume"])
    assert [json.loads(line)["iter"] for line in (out / "metrics.jsonl").read_text().splitlines()][-1] == 6
    capsys.readouterr()
    sample.main([f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=20", "--temperature=0"])
    text = capsys.readouterr().out
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 20 + 1
    sample.main([f"--out_dir=hf:{folder}", "--start=ROMEO:", "--max_new_tokens=20"])
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_what_cannot_be_imported_is_one_line_and_nothing_is_written(corpus, data_dir, tmp_path, monkeypatch, capsys):
    folder, _ = saved("gpt2", tmp_path / "gpt2", corpus)
    llama = tmp_path / "llama"
    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=70, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
        )
    ).save_pretrained(llama)
    damaged = shutil.copytree(folder, tmp_path / "damaged")
    weights = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # a download cut short
    assert (
        prepare.main(
            ["--input", str(corpus), "--data_dir", str(tmp_path), "--dataset", "own", "--tokenizer", f"hf:{folder}"]
        )
        == 0
    )
    cases = {  # flag, value, the error's gist
        "unknown": ("init_from", "hf:no-such-org/no-such-model", "no transformers model of that name or path"),
        "offline": (
            "init_from",
            "hf:no-such-org/no-such-model",
            "init_from=hf:no-such-org/no-such-model: "
            "no-such-org/no-such-model is not in the local Hugging Face cache and 127.0.0.1 cannot be reached",
        ),
        "no folder": (
            "init_from",
            f"hf:{tmp_path}/no/such/folder",
            f"the folder {tmp_path}/no/such/folder does not exist",
        ),
        "damaged": ("init_from", f"hf:{damaged}", f"init_from=hf:{damaged}: its weights cannot be read"),
        "damaged, sampled": ("out_dir", f"hf:{damaged}", f"out_dir=hf:{damaged}: its weights cannot be read"),
        "architecture": ("init_from", f"hf:{llama}", "is a LlamaForCausalLM (llama); nanorope imports GPT-2"),
        "tokenizer": (
            "init_from",
            f"hf:{folder}",
            f"init_from=hf:{folder} reads the ids of the hf tokenizer of "
            f"{folder}, but dataset 'shakespeare_char' was prepared with the char tokenizer",
        ),
    }
    for name, (flag, value, gist) in cases.items():
        out = tmp_path / f"run-{name}"
        capsys.readouterr()
        with monkeypatch.context() as m:
            if name == "offline":  # no network: the hub's address refuses at once, as an offline machine's does
                m.setattr(constants, "HF_HUB_OFFLINE", False)
                m.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
            t0 = time.perf_counter()
            with pytest.raises(SystemExit) as e:
                if flag == "init_from":  # a damaged model meets a dataset of its own tokenizer: its weights are read
                    data = (
                        [f"--data_dir={tmp_path}", "--dataset=own"] if name == "damaged" else [f"--data_dir={data_dir}"]
                    )
                    train.main([*TINY, *data, f"--out_dir={out}", f"--init_from={value}", "--max_iters=2"])
                else:
                    sample.main([f"--out_dir={value}", "--max_new_tokens=2"])
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.count("\n") == 1 and gist in err, (name, err)
        assert not out.exists() and time.perf_counter() - t0 < 10, name
