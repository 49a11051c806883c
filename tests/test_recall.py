"""data/recall.py: task rows written deterministically, every trained target an answer its needle tells, each
query's needle drawn with replacement (no elimination cue), rows of a drawn number of needles asking every slot;
the probe windows' geometry: one block of needles side by side at every place it fits, each needle's distance to
its query counted right, every slot asked at every distance it reaches equally often."""

import itertools

import pytest
import torch

from data.recall import FILLER, KEYS, NEEDLE, VALUES, Recall, query_keys
from data.tokenizer import CharTokenizer

TOK = CharTokenizer(sorted(set("\n !',:;?" + FILLER + KEYS + VALUES)))
KEY_IDS = {TOK.stoi[k] for k in KEYS}


def text(*shape, seed=0):
    return torch.randint(len(TOK.chars), shape, generator=torch.Generator().manual_seed(seed))


def letters(row):
    """Positions of the key letters in a row of tokens."""
    return [t for t, c in enumerate(row.tolist()) if c in KEY_IDS]


def needles_of(row):
    """{key: start} of a row's needles: each key's first occurrence (later ones are queries)."""
    out = {}
    for t in letters(row):
        out.setdefault(row[t].item(), t)
    return out


def test_task_rows_are_deterministic_and_each_trained_target_is_its_needles_answer():
    task = Recall(TOK, pairs=4, queries=3)
    rows = text(64, 65)
    x, y = task.insert(rows, 0.5, seed=7)
    again = task.insert(rows, 0.5, seed=7)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1]) and not torch.equal(x, task.insert(rows, 0.5, 8)[0])
    assert torch.equal(rows, text(64, 65))  # the input is not modified
    full = torch.cat((x, y[:, -1:]), 1)  # the last token: a query's W (a target), or untrained filler (-1)
    chosen = [i for i in range(64) if not torch.equal(full[i], rows[i])]
    assert 20 < len(chosen) < 44  # about half of the rows; the others are text, every target trained
    assert all((y[i] == rows[i, 1:]).all() for i in range(64) if i not in chosen)
    ends = set()
    for i in chosen:
        at = letters(full[i])
        q0 = at[4]  # 4 needles, then 3 queries one after another, ending anywhere up to the row's end
        assert len(at) == 7 and at[4:] == query_keys(q0 + 9, 3) == [q0, q0 + 3, q0 + 6] and at[3] + NEEDLE <= q0
        needles = {full[i, a].item(): full[i, a + 1 : a + 3].tolist() for a in at[:4]}
        assert len(needles) == 4 and len({c for v in needles.values() for c in v}) == 8  # distinct keys and capitals
        assert all(b - a >= NEEDLE for a, b in itertools.pairwise(at[:4]))  # needles do not overlap
        assert set((y[i] != -1).nonzero().flatten().tolist()) == {q + d for q in at[4:] for d in (0, 1)}
        for q in at[4:]:  # the targets at a query's key and V are its needle's V and W
            assert y[i, q : q + 2].tolist() == needles[full[i, q].item()]
        others = [c for t, c in enumerate(full[i].tolist()) if c >= 0 and all(not 0 <= t - a < NEEDLE for a in at)]
        assert set(others) <= {TOK.stoi[c] for c in FILLER}  # the rest is filler, without letters
        ends.add(q0 + 9)
    assert len(ends) > 5  # the queries end at many places


def test_each_query_draws_its_needle_with_replacement():
    pairs, queries = 4, 4
    x, _ = Recall(TOK, pairs, queries).insert(torch.zeros(2000, 65, dtype=torch.long), 1.0, seed=3)
    fresh, repeats, last_needle = 0, 0, []
    for row in x:
        at = letters(row)
        asked = [row[t].item() for t in at[pairs:]]
        order = list(needles_of(row))
        repeats += len(set(asked)) < queries
        fresh += asked[-1] not in asked[:-1]
        last_needle.append(order.index(asked[-1]))
    # the last query asks a needle the earlier ones did not with probability ((pairs - 1) / pairs)^(queries - 1),
    # not 1 as when every needle is queried once: the needles asked before say nothing of the next one
    expected, sd = (3 / 4) ** 3, ((3 / 4) ** 3 * (1 - (3 / 4) ** 3) / 2000) ** 0.5
    assert abs(fresh / 2000 - expected) < 4 * sd and repeats > 1000
    counts = torch.bincount(torch.tensor(last_needle), minlength=pairs) / 2000
    assert (counts - 1 / pairs).abs().max() < 0.04  # uniform over the needles, whatever their place


@pytest.mark.parametrize("W", [50, 64])
def test_block_windows_stand_the_needles_side_by_side_at_every_place_each_distance_counted_to_the_query(W):
    task, query = Recall(TOK, pairs=6), W - 2  # the query's key in the window x = row[:-1]
    contexts, needles, distance = task.block_windows(W, 2, torch.Generator().manual_seed(0))
    places = query - 6 * NEEDLE + 1  # the block's starts: 0 to the last that leaves the query's place free
    assert contexts.shape == (2 * places, W + 1) and distance.shape == needles.shape[:2] == (2 * places, 6)
    starts = []
    for row, ns, ds in zip(contexts, needles, distance, strict=True):
        found = needles_of(row)
        at = sorted(found.values())
        assert len(found) == 6 and letters(row) == at  # needles alone; the query's place is filler
        assert at == list(range(at[0], at[0] + 6 * NEEDLE, NEEDLE)) and at[-1] + NEEDLE <= query  # side by side
        assert len({c for a in at for c in row[a + 1 : a + 3].tolist()}) == 12  # distinct capitals
        for needle, d in zip(ns, ds.tolist(), strict=True):
            start = found[needle[0].item()]
            assert row[start : start + NEEDLE].tolist() == needle.tolist() and start == query - d
        starts.append(at[0])
    assert sorted(starts) == sorted(list(range(places)) * 2)  # every place, twice
    # so slot i is asked at each distance it reaches twice: from 3 (6 - i), the block against the query, to the query
    # minus 3 i, the block at the window's start
    for i in range(6):
        assert sorted(distance[:, i].tolist()) == sorted(list(range(3 * (6 - i), query - 3 * i + 1)) * 2)


def test_rows_of_fewest_to_pairs_needles_ask_every_slot_a_probe_of_pairs_needles_asks():
    probe_pairs = 10  # the probe's windows hold 10 needles, its slot check asks all 10
    x, y = Recall(TOK, pairs=probe_pairs, fewest=5).insert(torch.zeros(600, 65, dtype=torch.long), 1.0, seed=4)
    full, sizes = torch.cat((x, y[:, -1:]), 1), []
    for i in range(600):
        at = letters(full[i])
        n = len(at) // 2  # as many queries as needles, one after another at the end
        needles = {full[i, a].item(): full[i, a + 1 : a + 3].tolist() for a in at[:n]}
        assert len(needles) == n and at[n:] == query_keys(at[-1] + NEEDLE, n)
        assert set((y[i] != -1).nonzero().flatten().tolist()) == {q + d for q in at[n:] for d in (0, 1)}
        assert all(y[i, q : q + 2].tolist() == needles[full[i, q].item()] for q in at[n:])
        sizes.append(n)
    counts = torch.bincount(torch.tensor(sizes), minlength=11)[5:] / 600
    assert (counts - 1 / 6).abs().max() < 0.06  # 5 to 10 needles, uniform: every slot up to 10 is trained
    fixed, _ = Recall(TOK, pairs=6, queries=4, fewest=2).insert(torch.zeros(200, 65, dtype=torch.long), 1.0, seed=5)
    for row in fixed:  # a fixed number of queries, each asking one of its row's 2 to 6 needles
        at = letters(row)
        assert len(at) - 4 in range(2, 7) and {row[q].item() for q in at[-4:]} <= set(needles_of(row))


def test_slot_windows_query_every_needle_once_at_the_end():
    task = Recall(TOK, pairs=5)
    rows = task.slot_windows(40, 20, torch.Generator().manual_seed(2))
    keys = query_keys(41, 5)
    for row in rows:
        needles = needles_of(row)
        assert letters(row)[5:] == keys and {row[q].item() for q in keys} == set(needles)  # each key once
        assert all(row[q + 1 : q + 3].tolist() == row[needles[row[q].item()] + 1 :][:2].tolist() for q in keys)
        assert max(needles.values()) + NEEDLE <= keys[0]


def test_windows_too_short_for_the_needles_fail_with_what_is_valid():
    task = Recall(TOK, pairs=10)
    g = torch.Generator().manual_seed(0)
    # a block of 10 needles is 30 tokens, before the query's 3 (the window's last but one)
    with pytest.raises(ValueError, match=r"W=31 tokens cannot hold a block of 10 needles .* valid: W >= 32"):
        task.block_windows(31, 1, g)
    assert len(task.block_windows(32, 1, g)[0]) == 1  # one place
    with pytest.raises(ValueError, match="valid: W >= 59"):
        task.slot_windows(40, 1, g)
    with pytest.raises(ValueError, match=r"block_size=24 cannot hold 10 needles and their queries \(42 tokens\)"):
        Recall(TOK, 10, 4).insert(torch.zeros(1, 25, dtype=torch.long), 1.0, 0)
    with pytest.raises(ValueError, match="recall_queries=0 must be a positive integer"):
        Recall(TOK, 4, 0)
    for fewest in (0, 5):
        with pytest.raises(AssertionError, match=rf"recall_fewest={fewest} must lie in \[1, recall_pairs=4\]"):
            Recall(TOK, 4, fewest=fewest)
