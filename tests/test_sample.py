"""sample.py end to end on two tiny trained checkpoints: controls, exactness, --compare, bad input."""

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F

import export
import sample
from checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from conftest import TINY, run
from data.tokenizer import TiktokenTokenizer, bpe_encoding
from model import GPT, GPTConfig
from source import SourceSettings

SCHEMES = ("rope", "sinusoidal")
PROMPT = "ROMEO:\nThe"
GREEDY = ["--temperature=0", "--max_new_tokens=80", "--device=cpu"]  # 80 tokens: two slides of a 32-token window


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # the tiny models are overhead-bound: extra threads only contend on a shared machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def runs(data_dir, tmp_path_factory):
    """out-rope and out-sinusoidal, trained just past uniform guessing (greedy text that varies), in parallel."""
    root = tmp_path_factory.mktemp("runs")
    env = os.environ | {"OMP_NUM_THREADS": "1"}

    def train(scheme):
        run(
            "train.py",
            *TINY,
            f"--pos_emb={scheme}",
            f"--data_dir={data_dir}",
            f"--out_dir={root / f'out-{scheme}'}",
            "--max_iters=200",
            "--batch_size=8",
            "--learning_rate=1e-2",
            "--warmup_iters=0",
            "--eval_interval=100",
            env=env,
        )

    with ThreadPoolExecutor(len(SCHEMES)) as pool:
        list(pool.map(train, SCHEMES))
    return root


def cli(capsys, *args):
    """Run sample.py's main in-process: (stdout, stderr)."""
    sample.main([str(a) for a in args])
    return capsys.readouterr()


def fails(capsys, *args):
    """Run main expecting bad input: the one-line error on stderr."""
    with pytest.raises(SystemExit) as exit_:
        sample.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert exit_.value.code not in (0, None)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# ----------------------------------------------------------------------------- one model


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.slow
def test_greedy_text_is_the_same_with_and_without_the_cache(runs, capsys, scheme):
    args = [f"--out_dir={runs / f'out-{scheme}'}", f"--start={PROMPT}", *GREEDY]
    cached, err = cli(capsys, *args)
    assert cached.startswith(PROMPT) and len(cached) == len(PROMPT) + 80 + 1  # char-level: a token is a character
    assert len(set(cached[len(PROMPT) :])) > 2, "the model is too untrained for the comparison to mean anything"
    assert f"pos_emb={scheme}" in err and "kv cache on" in err
    recomputed, err = cli(capsys, *args, "--kv_cache=false")
    assert recomputed == cached
    assert "kv cache off" in err
    static, err = cli(capsys, *args, "--static_cache")
    assert static == cached
    assert "static kv cache" in err


def test_same_seed_same_text_other_seed_other_text(runs, capsys):
    args = [f"--out_dir={runs / 'out-rope'}", "--max_new_tokens=60", "--temperature=1", "--device=cpu"]
    a, b, c = (cli(capsys, *args, f"--seed={s}")[0] for s in (1, 1, 2))
    assert a == b
    assert a != c


def test_text_streams_to_stdout_token_by_token(runs, capsys, monkeypatch):
    writes = []
    monkeypatch.setattr(sample.sys.stdout, "write", lambda s: writes.append(s) or len(s))
    cli(capsys, f"--out_dir={runs / 'out-rope'}", "--max_new_tokens=30", "--start=A", "--device=cpu")
    pieces = [w for w in writes if w]
    assert pieces[0] == "A" and pieces[-1] == "\n"
    assert len(pieces) == 1 + 30 + 1 and all(len(p) == 1 for p in pieces)  # the prompt, each token, the end


def test_streaming_waits_for_the_rest_of_a_multi_byte_character(monkeypatch):
    # a byte-level tokenizer spells "é" in two tokens: the stream must never show half of it
    def generate(*args, **kwargs):  # stands in for the decoding engine: yields the given token ids
        yield from (torch.tensor([[b]]) for b in "aé!".encode())

    monkeypatch.setattr(sample, "generate", generate)
    sampler = object.__new__(sample.Sampler)
    sampler.model, sampler.ids = None, torch.zeros(1, 1, dtype=torch.long)
    sampler.tok = TiktokenTokenizer(bpe_encoding({bytes([i]): i for i in range(256)}), "bpe")
    args = sample.SampleConfig(max_new_tokens=4)
    writes = []
    text, _ = sampler.sample(args, None, write=writes.append)
    assert text == "aé!" and [w for w in writes if w] == ["a", "é", "!"]


def test_prompt_from_file_equals_the_same_prompt_inline(runs, capsys, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text(PROMPT, encoding="utf-8")
    args = [f"--out_dir={runs / 'out-rope'}", *GREEDY]
    assert cli(capsys, *args, f"--start=FILE:{path}")[0] == cli(capsys, *args, f"--start={PROMPT}")[0]


def test_empty_prompt_starts_from_the_start_token(runs, capsys):
    # the char tokenizer's start token is the newline: an empty prompt continues as "\n" does, unprinted
    args = [f"--out_dir={runs / 'out-rope'}", *GREEDY]
    empty, newline = cli(capsys, *args, "--start=")[0], cli(capsys, *args, "--start=\n")[0]
    assert len(empty) == 80 + 1 and newline == "\n" + empty


def test_num_samples_continue_one_random_stream(runs, capsys):
    args = [
        f"--out_dir={runs / 'out-rope'}",
        "--max_new_tokens=40",
        "--temperature=1",
        "--seed=3",
        "--start=A",
        "--device=cpu",
    ]
    three = cli(capsys, *args, "--num_samples=3")[0].split("-" * 40 + "\n")
    assert len(three) == 3 and len(set(three)) == 3
    assert all(s.startswith("A") and len(s) == 1 + 40 + 1 for s in three)
    assert three[0] == cli(capsys, *args)[0]


def test_bare_command_samples_the_newest_run_here(runs, capsys, monkeypatch):
    # what a user types right after training: no --out_dir, no out/ folder
    monkeypatch.chdir(runs)
    newest = max(SCHEMES, key=lambda s: (runs / f"out-{s}" / "best.pt").stat().st_mtime)
    out, err = cli(capsys, "--max_new_tokens=10", "--device=cpu")
    assert err.startswith(f"out-{newest}/best.pt: pos_emb={newest}")
    assert len(out) == 1 + 10 + 1  # the default prompt "\n", the sample, the end


# ----------------------------------------------------------------------------- --compare


def reference_prompt_loss(path, prompt):
    """Mean negative log-likelihood of each prompt character after the start token, from the logits."""
    ckpt = load_checkpoint(path)
    model = model_from_checkpoint(ckpt).eval()
    chars, start = ckpt["tokenizer"]["chars"], ckpt["tokenizer"]["start_id"]
    ids = torch.tensor([[start] + [chars.index(c) for c in prompt]])
    with torch.no_grad():
        logits = model(ids[:, :-1], targets=ids[:, 1:])[0][0]  # (T, vocab)
    return -F.log_softmax(logits, -1)[torch.arange(len(prompt)), ids[0, 1:]].mean().item()


def expected_stats(runs):
    for scheme in SCHEMES:
        ckpt = load_checkpoint(runs / f"out-{scheme}" / "best.pt")
        params = model_from_checkpoint(ckpt).num_params()
        yield (
            scheme,
            f"{params / 1e3:.1f}K",
            f"{ckpt['best_val_loss']:.4f}",
            f"{reference_prompt_loss(runs / f'out-{scheme}' / 'best.pt', PROMPT):.4f}",
        )


def test_compare_prints_each_model_with_its_stats_and_samples(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    dirs = [runs / f"out-{s}" for s in SCHEMES]
    args = ["--seed=1", f"--start={PROMPT}", "--max_new_tokens=40", "--device=cpu"]
    out = cli(capsys, "--compare=" + ",".join(map(str, dirs)), *args)[0]
    for (scheme, params, best, prompt_loss), d in zip(expected_stats(runs), dirs, strict=True):
        row = next(line for line in out.splitlines() if line.startswith(str(d)))
        name, pos_emb, params_, iters, best_, prompt_loss_, rate = row.split()
        assert (pos_emb, params_, iters, best_, prompt_loss_) == (scheme, params, "200", best, prompt_loss)
        assert float(rate.replace(",", "")) > 0
        # each model's sample is the one it gives alone with the same seed
        alone = cli(capsys, f"--out_dir={d}", *args)[0].rstrip("\n")
        assert f"{d.name} ({scheme})" in out
        shown = [line[:40].rstrip() for line in alone.splitlines() if line.strip()]  # columns drop trailing spaces
        assert len(shown) >= 2 and all(line in out for line in shown)
    assert max(len(line) for line in out.splitlines() if " | " in line) <= 120


def test_compare_text_format_has_one_block_per_model(runs, capsys):
    dirs = [runs / f"out-{s}" for s in SCHEMES]
    out = cli(
        capsys,
        "--compare=" + ",".join(map(str, dirs)),
        "--format=text",
        "--seed=1",
        "--temperature=0",
        f"--start={PROMPT}",
        "--max_new_tokens=40",
        "--device=cpu",
    )[0]
    for d, scheme in zip(dirs, SCHEMES, strict=True):
        alone = cli(
            capsys, f"--out_dir={d}", "--temperature=0", f"--start={PROMPT}", "--max_new_tokens=40", "--device=cpu"
        )[0]
        assert f"=== {d} ({scheme}) ===\n{alone}" in out + "\n"


def test_compare_markdown_is_a_table_of_stats_and_one_of_samples(runs, capsys):
    dirs = [runs / f"out-{s}" for s in SCHEMES]
    out = cli(
        capsys,
        "--compare=" + ",".join(map(str, dirs)),
        "--format=markdown",
        "--seed=1",
        f"--start={PROMPT}",
        "--max_new_tokens=40",
        "--device=cpu",
    )[0]
    lines = out.splitlines()
    head = lines.index("| model | pos_emb | params | iters | best val loss | prompt loss | tokens/s |")
    assert re.fullmatch(r"\|---\|---\|(---:\|){5}", lines[head + 1])
    for line, (scheme, params, best, prompt_loss), d in zip(
        lines[head + 2 : head + 2 + len(dirs)], expected_stats(runs), dirs, strict=True
    ):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[:6] == [str(d).replace("_", "\\_"), scheme, params, "200", best, prompt_loss]
        assert float(cells[6].replace(",", "")) > 0
    titles = lines.index(
        "| " + " | ".join(f"{d} ({s})".replace("_", "\\_") for d, s in zip(dirs, SCHEMES, strict=True)) + " |"
    )
    assert lines[titles + 1] == "|---|---|"
    samples = lines[titles + 2].strip("|").split(" | ")
    assert len(samples) == 2 and all(s.strip().startswith("ROMEO:<br>The") for s in samples)


def test_markdown_cells_escape_what_markdown_would_read():
    row = {k: "a|b" for k in sample.STATS} | {"model": "m", "pos_emb": "rope", "samples": ["x|y\n*z*_<&"]}
    out = sample.as_markdown([row], "head")
    assert "| m | rope | a\\|b |" in out
    assert out.splitlines()[-1] == "| x\\|y<br>\\*z\\*\\_\\<\\& |"


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def foreign(tmp_path):
    """Run folders holding checkpoints of something else, and a file that is no checkpoint at all."""
    tokenizer = {"tokenizer": "char", "chars": ["a"], "start_id": 0}
    for name, ckpt in {
        "other": {"weights": torch.zeros(2)},
        "untokenized": {"model": {}, "model_config": {}},
        "misfit": {"model": {}, "model_config": {"n_layr": 2}, "tokenizer": tokenizer},
    }.items():
        (tmp_path / name).mkdir()
        torch.save(ckpt, tmp_path / name / "best.pt")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "best.pt").write_bytes(b"not a checkpoint")
    return tmp_path


@pytest.mark.parametrize(
    "args, named",
    [
        (["--start=ROMEO: ✓ ü"], "outside the vocabulary: '✓', 'ü'"),
        (["--max_new_tokens=0"], "max_new_tokens=0 must be a positive integer"),
        (["--max_new_tokens=-5"], "max_new_tokens=-5 must be a positive integer"),
        (["--max_new_tokens=many"], "max_new_tokens='many' is not a valid int"),
        (["--top_p=0"], "top_p=0.0 must lie in (0, 1]"),
        (["--top_p=1.5"], "top_p=1.5 must lie in (0, 1]"),
        (["--top_k=0"], "top_k=0 must be a positive integer"),
        (["--temperature=-1"], "temperature=-1.0 must be a finite number >= 0"),
        (["--temperature=nan"], "temperature=nan must be a finite number >= 0"),
        (["--kv_cache=maybe"], "kv_cache='maybe' is not a valid bool; use true or false"),
        (["--compile", "--kv_cache=false"], "compile=true compiles the cached decoding; it needs kv_cache=true"),
        (["--static_cache", "--kv_cache=false"], "static_cache=true is a kind of KV cache; it needs kv_cache=true"),
        (["--max_context=0"], "max_context=0 must be a positive integer"),
        (
            ["--rope_scaling=ntk", "--max_context=64"],
            "needs a RoPE model; {runs}/out-sinusoidal uses pos_emb=sinusoidal",
        ),
        (
            ["--out_dir={runs}/out-rope", "--rope_scaling=ntk", "--rope_scaling_factor=0.5"],
            "rope_scaling_factor=0.5 must be a finite number >= 1",
        ),
        (
            ["--out_dir={runs}/out-rope", "--max_context=64", "--rope_scaling=linear", "--rope_scaling_factor=0"],
            "rope_scaling_factor=0.0 must be a finite number >= 1",
        ),  # not silently the default factor
        (["--rope_scaling_factor=2"], "rope_scaling_factor=2 does nothing without a rope_scaling"),
        (["--rope_scaling=wild"], "rope_scaling='wild' must be one of none, linear, ntk, dynamic, yarn, llama3"),
        (["--format=html"], "format='html' must be one of columns, text, markdown"),
        (["--start=FILE:{runs}/nowhere.txt"], "prompt file '{runs}/nowhere.txt' does not exist"),
        (["--device=tpu"], "device='tpu' is unknown"),
        (["--colour=red"], "unknown config key 'colour'; --help lists every key"),
        (["--temprature=0"], "unknown config key 'temprature'; did you mean 'temperature'?"),  # as train.py says it
        (["--out_dir={runs}/out-rope", "--compare={runs}/out-rope"], "out_dir and compare exclude each other"),
        (
            ["--out_dir=hf:{runs}/no/such/folder"],
            "out_dir=hf:{runs}/no/such/folder: the folder {runs}/no/such/folder does not exist",
        ),
    ],
)
def test_bad_input_is_one_line_naming_it(runs, capsys, args, named):
    where = any(a.startswith(("--out_dir", "--compare")) for a in args)
    default = [] if where else [f"--out_dir={runs}/out-sinusoidal"]
    err = fails(capsys, "--device=cpu", *default, *(a.format(runs=runs) for a in args))
    assert named.format(runs=runs) in err


@pytest.mark.parametrize(
    "folder, named",
    [
        ("missing", "out_dir={d}/missing: no such run folder or checkpoint file"),
        ("other", "out_dir={d}/other: '{d}/other/best.pt' is not a nanorope checkpoint"),
        ("junk", "out_dir={d}/junk: '{d}/junk/best.pt' is not a readable checkpoint"),
        (
            "untokenized",
            "out_dir={d}/untokenized: '{d}/untokenized/best.pt' holds weights alone, without the tokenizer",
        ),
        (
            "misfit",
            "out_dir={d}/misfit: '{d}/misfit/best.pt' does not fit nanorope's model (GPTConfig.__init__() got an "
            "unexpected keyword",
        ),
    ],
)
def test_missing_or_foreign_checkpoint_is_refused(capsys, foreign, folder, named):
    err = fails(capsys, f"--out_dir={foreign / folder}", "--device=cpu")
    assert named.format(d=foreign) in err


def test_no_run_anywhere_says_how_to_make_one(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "no checkpoint in out/ or any other out*/ folder here" in fails(capsys, "--device=cpu")


def test_non_utf8_prompt_file_is_refused(runs, capsys, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    err = fails(capsys, f"--out_dir={runs / 'out-rope'}", f"--start=FILE:{tmp_path / 'latin1.txt'}")
    assert "is not UTF-8 text" in err


def test_the_real_command_exits_non_zero_without_a_traceback(runs, foreign):
    proc = run(
        "sample.py",
        f"--compare={runs / 'out-rope'},{foreign / 'other'}",
        "--device=cpu",
        check=False,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert (
        proc.stderr == f"error: compare={foreign}/other: '{foreign}/other/best.pt' is not a nanorope checkpoint "
        f"(it lacks the model and model_config entries)\n"
    )


def test_a_scaling_and_its_factor_follow_one_rule_in_the_model_sampling_and_export():
    refusals = []
    for settings in (
        lambda: GPTConfig(rope_scaling_factor=2.0),
        lambda: sample.SampleConfig(rope_scaling_factor=2.0),
        lambda: export.ExportConfig(hf_dir="hf-out", rope_scaling_factor=2.0),
    ):
        with pytest.raises(ValueError) as refused:
            settings()
        refusals.append(str(refused.value))
    assert (
        refusals
        == ["rope_scaling_factor=2 does nothing without a rope_scaling (linear, ntk, dynamic, yarn, llama3)"] * 3
    )


def test_sample_and_export_read_the_model_source_from_one_declaration():
    shared = {f.name for f in fields(SourceSettings)}
    assert shared == {"out_dir", "checkpoint", "rope_scaling", "rope_scaling_factor"}
    declared = [
        {f.name: f for f in fields(tool) if f.name in shared} for tool in (sample.SampleConfig, export.ExportConfig)
    ]
    assert declared[0] == declared[1] and {f.default for f in declared[0].values()} == {"", "best", None}


def test_a_sampling_scalings_default_factor_stretches_l0_to_max_context(tmp_path):
    """A model fine-tuned to 32 tokens from L0 = 16 and sampled at 64: s = 64 / 16, as every scaling reads L0."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, original_len=16, vocab_size=3))
    meta = {"tokenizer": "char", "chars": list("abc"), "start_id": 0}
    save_checkpoint(
        {"model": model.state_dict(), "model_config": model.config.asdict(), "tokenizer": meta}, tmp_path / "ckpt.pt"
    )
    sample_cfg = sample.SampleConfig(
        out_dir=str(tmp_path), checkpoint="latest", max_context=64, rope_scaling="linear", device="cpu"
    )
    sampler = sample.Sampler(sample_cfg.out_dir, "out_dir", "ab", sample_cfg, "cpu")
    assert (sampler.model.config.rope_scaling, sampler.model.config.rope_scaling_factor) == ("linear", 4.0)
