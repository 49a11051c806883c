"""lab/retrieval.py: the effective window and the mean of grids over seeds."""

from lab.retrieval import grid_mean, window


def test_the_effective_window_is_the_longest_length_retrieved_all_the_way_up_to():
    grid = {"16": {"0": {"answer": 1.0}, "1": {"answer": 0.9}}, "32": {"0": {"answer": 1.0}, "1": {"answer": 0.7}},
            "64": {"0": {"answer": 1.0}, "1": {"answer": 1.0}}, "128": None}
    assert window(grid, 0.9, 16) == 16  # 32 falls short (0.85 mean), so 64's success does not count
    assert window(grid, 0.8, 16) == 64 and window(grid, 0.99, 16) == 0
    assert window(grid, 0.9, 64) == 64  # from L0 = 64 up: the shorter windows do not gate it


def test_grids_of_seeds_average_cell_by_cell_and_keep_what_a_scheme_cannot_reach():
    a = {"16": {"0": {"answer": 1.0, "first": 1.0}}, "32": None}
    b = {"16": {"0": {"answer": 0.5, "first": 0.0}}, "32": None}
    assert grid_mean([a, b]) == {"16": {"0": {"answer": 0.75, "first": 0.5}}, "32": None}
