"""rope_figures.py: the four figures of docs/rope.md are drawn, and the numbers behind two of them are right."""

import pytest
import torch

import rope_figures

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = ("pairs.png", "wavelengths.png", "decay.png", "identity.png")


def test_the_command_writes_four_pngs_and_names_them(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rope_figures.main([f"--out_dir={tmp_path}", "--dim=8", "--original_len=16", "--factor=2"])
    for name in NAMES:
        assert (tmp_path / name).read_bytes()[:8] == PNG
    printed = capsys.readouterr().out
    assert all(f"wrote {tmp_path / name}" in printed for name in NAMES)


def test_scores_through_apply_rope_depend_on_the_distance_alone():
    # a sign or layout slip in apply_rope, or R(m - n) for R(n - m), puts scores off by order 1, not 1e-6
    scores, reference, gaps = rope_figures.identity_scores(8, 10000.0, torch.tensor([0, 1, 5, 17, 300, 4095]))
    assert (scores.double() - reference).abs().max() < 1e-5
    assert gaps.tolist()[:6] == [0, 1, 5, 17, 300, 4095]  # row m = 0: n - m = n


def test_decay_bound_starts_at_its_maximum_and_falls():
    # at distance 0 every partial sum |S_j| is j, so the mean over j = 1..d/2 is (d/2 + 1)/2
    bound = rope_figures.decay_bound(128, 10000.0, torch.arange(257))
    assert bound[0].item() == pytest.approx(32.5, abs=1e-12)
    assert bound.argmax() == 0 and bound[200:].max() < bound[0] / 2
