"""bench.py: a quick run's JSON lines keep the contract and their figures agree with each other;
the benchmark's reference RoPE formulations are right; bad flags give one-line errors."""

import json
import math

import pytest
import torch

import bench
import rope
from conftest import run
from model import GPT, GPTConfig

SPREAD = ("ms_median", "ms_min", "ms_max")


@pytest.fixture(scope="module")
def records():
    proc = run("bench.py", "--quick", "--json", timeout=300)
    return [json.loads(line) for line in proc.stdout.splitlines()]  # every line must parse


def only(records, name):
    return [r for r in records if r["bench"] == name]


@pytest.mark.slow
def test_every_bench_reports_finite_positive_figures_with_their_spread(records):
    assert {r["bench"] for r in records} == set(bench.DEFAULT_BENCHES)
    for r in records:
        assert r["device"] == "cpu" and r["repeats"] == 3, r
        assert 0 < r["ms_min"] <= r["ms_median"] <= r["ms_max"], r
        for key, value in r.items():
            if isinstance(value, float) and key != "rotation_share":
                assert math.isfinite(value) and value > 0, (key, r)
    # a difference of two medians: at the quick shape the rotation costs about as much as the noise, either side of 0
    (eager,) = [r for r in only(records, "train_step") if not r["compiled"]]
    assert -1 < eager["rotation_share"] < 1, eager


def test_variants_cover_the_contract(records):
    assert [r["compiled"] for r in only(records, "train_step")] == [False]  # --quick skips torch.compile
    assert sorted((r["kv_cache"], r["static_cache"], r["compiled"]) for r in only(records, "generate")) == [
        (False, False, False),
        (True, False, False),
        (True, True, False),
    ]
    impls = {(r["impl"], r["layout"]) for r in only(records, "rope_apply")}
    assert impls == {
        ("rotate_pairs", "interleaved"),
        ("apply_rope", "interleaved"),
        ("apply_rope", "half"),
        ("complex", "interleaved"),
        ("rotate_half", "half"),
        ("clone", None),
    }


def test_derived_figures_follow_from_the_measured_times(records):
    (peak,) = only(records, "matmul_peak")
    assert peak["gflops"] == pytest.approx(2 * peak["n"] ** 3 / (peak["ms_median"] / 1e3) / 1e9)
    (step,) = only(records, "train_step")  # its MFU divides by a matmul peak timed in the same rounds
    tokens = step["batch_size"] * step["block_size"]
    assert step["tokens_per_s"] == pytest.approx(tokens / (step["ms_median"] / 1e3))
    # MFU from an independent count: 6 FLOPs per parameter per token plus attention's 12 * L * T * C
    cfg = GPTConfig(**{k: step[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")})
    flops = 6 * sum(p.numel() for p in GPT(cfg).parameters()) + 12 * cfg.n_layer * cfg.block_size * cfg.n_embd
    assert step["mfu"] == pytest.approx(flops * step["tokens_per_s"] / (step["peak_gflops"] * 1e9))
    (uncached,) = [r for r in only(records, "generate") if not r["kv_cache"]]
    for r in only(records, "generate"):
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / (r["ms_median"] / 1e3))
        if r["kv_cache"]:  # dynamic and static
            assert r["speedup"] == pytest.approx(r["tokens_per_s"] / uncached["tokens_per_s"])
    rows = {r["impl"] + "/" + str(r["layout"]): r for r in only(records, "rope_apply")}
    clone = rows["clone/None"]["ms_median"]
    best_ref = min(rows["complex/interleaved"]["ms_median"], rows["rotate_half/half"]["ms_median"])
    for key in ("apply_rope/interleaved", "apply_rope/half"):
        assert rows[key]["vs_clone"] == pytest.approx(rows[key]["ms_median"] / clone)
        assert rows[key]["vs_best_reference"] == pytest.approx(rows[key]["ms_median"] / best_ref)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_reference_formulations_match_the_rotation_matrix(layout):
    # the paper's explicit R(m), not apply_rope, is the reference: the benchmark's own check compares with apply_rope
    d, T = 8, 5
    x = torch.randn(2, 3, T, d)
    cos, sin = rope.tables(rope.frequencies(d), torch.arange(T))
    perm = rope.half_to_interleaved(d)
    want = torch.stack([x[..., m, :].double() @ rope.rotation_matrix(d, m).T for m in range(T)], dim=-2)
    name = "complex" if layout == "interleaved" else "rotate_half"
    _, fn = bench.rope_impls(cos, sin)[name]
    if layout == "half":  # move to the interleaved pairing, rotate there, move back
        want = torch.stack([x[..., m, perm].double() @ rope.rotation_matrix(d, m).T for m in range(T)], dim=-2)
        want = want[..., perm.argsort()]
    torch.testing.assert_close(fn(x).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--only", "train_step,nope"],
            "unknown bench nope; choose from matmul_peak, train_step, generate, rope_apply",
        ),
        (["--config", "no/such.toml"], "does not exist"),
        (["--device", "tpu"], "device='tpu' is unknown"),
        (["--repeats", "0"], "repeats=0 must be a positive integer"),
        (["--repeat=3"], "unknown config key 'repeat'; did you mean 'repeats'?"),
    ],
)
def test_bad_flags_give_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 1 and err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.slow
def test_to_loss_times_whole_commands_against_nanogpts_and_reads_their_last_val_loss(data_dir, tmp_path):
    # a stand-in nanoGPT checkout: its train.py logs as nanoGPT's does (the stand-in is ours: the real one is fetched)
    fake = tmp_path / "nanoGPT"
    (fake / "data/shakespeare_char").mkdir(parents=True)
    (fake / "data/shakespeare_char/train.bin").write_bytes(b"")
    (fake / "train.py").write_text(
        'print("step 0: train loss 4.1000, val loss 4.2000")\nprint("step 2000: train loss 1.7000, val loss 1.8860")\n'
    )
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(
        f'data_dir = "{data_dir}"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\nbatch_size = 2\n'
        'max_iters = 3\neval_interval = 3\neval_iters = 1\ndtype = "auto"\n'
    )
    proc = run(
        "bench.py",
        "--json",
        "--only=to_loss",
        "--repeats=1",
        "--threads=1",
        f"--config={tiny}",
        f"--nanogpt={fake}",
        timeout=300,
    )
    rows = {r["command"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) >= {"nanogpt", "nanorope float32"} and len(rows) in (2, 3)  # auto may run as float32 here
    assert rows["nanogpt"]["val_loss"] == 1.886 and rows["nanogpt"]["vs_nanogpt"] == 1.0
    for r in rows.values():
        assert r["repeats"] == 1 and math.isfinite(r["val_loss"])
        assert r["vs_nanogpt"] == pytest.approx(rows["nanogpt"]["ms_median"] / r["ms_median"])


@pytest.mark.slow
def test_probe_times_the_labs_scoring_at_each_probed_window_in_the_dtype_asked(data_dir, tmp_path):
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(
        f'data_dir = "{data_dir}"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 32\nbatch_size = 2\n'
        'dtype = "auto"\n'
    )
    proc = run(
        "bench.py",
        "--json",
        "--quick",
        "--only=probe",
        f"--config={tiny}",
        "--dtype=float32",
        "--probe_lengths=1,2",
        "--probe_pairs=4",
        "--probe_trials=2",
        "--probe_slots=16",
        timeout=300,
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["probe"], r["window"], r["read"], r["windows"]) for r in rows] == [
        # each query a window: the block of 4 needles (12 tokens) at each of its places, twice, each needle asked
        ("distance", 32, "whole", 2 * (32 - 2 - 12 + 1) * 4),  # each query's window read whole, as before
        ("distance", 32, "forked", 2 * (32 - 2 - 12 + 1) * 4),  # each context read once for its queries
        ("distance", 64, "whole", 2 * (64 - 2 - 12 + 1) * 4),
        ("distance", 64, "forked", 2 * (64 - 2 - 12 + 1) * 4),
        ("slot", 32, "whole", 16),
    ]
    for r in rows:
        assert r["dtype"] == "float32" and r["threads"] == 1 and not r["compiled"] and r["repeats"] == 3, r
        assert r["windows_per_s"] == pytest.approx(r["windows"] / (r["ms_median"] / 1e3))
        assert r["answers_per_s"] == pytest.approx(r["windows_per_s"] * (4 if r["probe"] == "slot" else 1))
        assert r["tokens_per_s"] == pytest.approx(r["windows_per_s"] * r["window"])


def test_to_loss_without_a_prepared_nanogpt_is_one_line(tmp_path):
    proc = run("bench.py", "--only=to_loss", f"--nanogpt={tmp_path}", check=False)
    assert proc.returncode == 1 and "needs --nanogpt DIR" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
