"""data/recall.py: task rows written deterministically, every trained target an answer its needle tells; the probe
scores a model that retrieves as 1 and one that guesses as 0, at every depth."""

import contextlib

import pytest
import torch

from data.recall import FILLER, KEYS, NEEDLE, VALUES, Recall
from data.tokenizer import CharTokenizer

TOK = CharTokenizer(sorted(set("\n !',:;?" + FILLER + KEYS + VALUES)))


class Runtime:
    @staticmethod
    def autocast():
        return contextlib.nullcontext()


def text(*shape, seed=0):
    return torch.randint(len(TOK.chars), shape, generator=torch.Generator().manual_seed(seed))


def test_task_rows_are_deterministic_and_each_trained_target_is_its_needles_answer():
    task = Recall(TOK, pairs=4)
    rows = text(64, 65)
    x, y = task.insert(rows, 0.5, seed=7)
    again = task.insert(rows, 0.5, seed=7)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1]) and not torch.equal(x, task.insert(rows, 0.5, 8)[0])
    assert torch.equal(rows, text(64, 65))  # the input is not modified
    full = torch.cat((x, y[:, -1:]), 1)  # the last token: a query's W (a target), or untrained filler (-1)
    chosen = [i for i in range(64) if not torch.equal(full[i], rows[i])]
    assert 20 < len(chosen) < 44  # about half of the rows; the others are text, every target trained
    assert all((y[i] == rows[i, 1:]).all() for i in range(64) if i not in chosen)
    keys, ends = {TOK.stoi[k] for k in KEYS}, set()
    for i in chosen:
        letters = [t for t, c in enumerate(full[i].tolist()) if c in keys]
        q0 = letters[4]  # 4 needles, then 4 queries one after another, ending anywhere up to the row's end
        assert len(letters) == 8 and letters[4:] == [q0, q0 + 3, q0 + 6, q0 + 9] and letters[3] + NEEDLE <= q0
        needles = {full[i, a].item(): full[i, a + 1:a + 3].tolist() for a in letters[:4]}
        assert len(needles) == 4 and len({c for v in needles.values() for c in v}) == 8  # distinct keys and capitals
        assert all(b - a >= NEEDLE for a, b in zip(letters[:4], letters[1:4]))  # needles do not overlap
        assert set((y[i] != -1).nonzero().flatten().tolist()) == {q + d for q in letters[4:] for d in (0, 1)}
        for q in letters[4:]:  # the targets at a query's key and V are its needle's V and W
            assert y[i, q:q + 2].tolist() == needles[full[i, q].item()]
        others = [c for t, c in enumerate(full[i].tolist()) if c >= 0 and all(not 0 <= t - a < NEEDLE for a in letters)]
        assert set(others) <= {TOK.stoi[c] for c in FILLER}  # the rest is filler, without letters
        ends.add(q0 + 12)
    assert len(ends) > 5  # the queries end at many places


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_probe_scores_retrieval_as_one_and_guessing_as_zero(depth):
    task = Recall(TOK)
    seen = {}

    class Windows:
        def eval_batches(self, split):
            yield text(8, 32, seed=1), text(8, 32, seed=2)

    def retriever(x, y):  # at each letter, the two tokens after its earlier occurrence
        seen["x"] = x
        logits = torch.zeros(*x.shape, len(TOK.chars))
        for b, row in enumerate(x.tolist()):
            for t, token in enumerate(row):
                earlier = [s for s in range(t) if row[s] == token]
                if earlier and earlier[-1] + 1 < t:
                    logits[b, t, row[earlier[-1] + 1]] = 1
        return logits, None

    assert task.scores(retriever, Windows(), depth, Runtime) == {"answer": 1.0, "first": 1.0}
    keys = [t for t, c in enumerate(seen["x"][0].tolist()) if TOK.chars[c] in KEYS]
    assert keys[-4:] == [21, 24, 27, 30] and round(depth * 18) in keys  # the queries at the end, the asked needle at its depth
    assert seen["x"][0, round(depth * 18)] == seen["x"][0, 30]  # the last query asks it
    guess = task.scores(lambda x, y: (torch.zeros(*x.shape, len(TOK.chars)), None), Windows(), depth, Runtime)
    assert guess["answer"] == 0.0 and guess["first"] <= 0.0
