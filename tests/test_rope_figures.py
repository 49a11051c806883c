"""rope_figures.py: the four figures of docs/rope.md are drawn, with the numbers and names the text quotes."""

import numpy as np
import pytest
import torch

import rope_figures
import scalings

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = ("pairs.png", "wavelengths.png", "decay.png", "identity.png")


def test_the_command_writes_four_pngs_and_names_them(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rope_figures.main([f"--out_dir={tmp_path}", "--dim=8", "--original_len=16", "--factor=2"])
    for name in NAMES:
        assert (tmp_path / name).read_bytes()[:8] == PNG
    printed = capsys.readouterr().out
    assert all(f"wrote {tmp_path / name}" in printed for name in NAMES)
    assert "decay bound (d = 128," in printed  # the paper's head, whatever --dim the other figures use
    assert "PI: of 4 pairs" in printed and "linear" not in printed  # the legend's names are the text's


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


def test_decay_bound_at_d_128_is_roformers_figure_2():
    # the paper's formula summed term by term in numpy float64, apart from decay_bound's torch cumsum:
    # theta_k = 10000^(-2k/d), S_j = sum_{k<j} e^{i r theta_k}, bound = mean over j = 1..d/2 of |S_j|
    theta = 10000.0 ** (-2 * np.arange(64) / 128)

    def paper(r):
        return np.mean([abs(np.exp(1j * r * theta[:j]).sum()) for j in range(1, 65)])

    distances = (0, 50, 250)
    bound = rope_figures.decay_bound(128, 10000.0, torch.tensor(distances))
    assert bound.tolist() == pytest.approx([paper(r) for r in distances], rel=1e-12)
    # read off RoFormer's Figure 2: about 32.5 at distance 0, 12.6 at 50, 6.5 at 250
    assert bound.tolist() == pytest.approx([32.5, 12.6, 6.5], abs=0.1)


def test_scores_are_constant_along_diagonals_and_not_along_rows():
    q, k = rope_figures.random_query_key(8)
    grid = rope_figures.rotated_scores(q, k, 10000.0, torch.arange(32))  # (P, P): [m, n]
    # [m + 1, n + 1] has the same n - m as [m, n]: equal up to float32 rounding
    assert (grid[1:, 1:] - grid[:-1, :-1]).abs().max() < 1e-5
    # along a row n - m changes, and so does the score, by order 1
    assert (grid[:, 1:] - grid[:, :-1]).abs().max() > 0.1


def test_every_scaling_has_a_name_and_a_line_in_the_wavelength_figure():
    assert set(rope_figures.SCALING_LINES) == set(scalings.SCALINGS)
    names = [name for name, _ in rope_figures.SCALING_LINES.values()]
    assert len(set(names)) == len(names)
    assert {"PI", "NTK", "dynamic NTK", "YaRN", "Llama 3"} <= set(names)
