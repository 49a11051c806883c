"""passkey.py: the passkeys written into training rows, and the probe's score."""

import torch

from data.tokenizer import CharTokenizer
from data.passkey import KEY_LEN, LETTERS, MARKER, Passkeys

TOK = CharTokenizer(sorted(set("abc de\n" + MARKER + LETTERS)))
TEXT = torch.tensor(TOK.encode("abc de\n"))  # the filler: neither marker nor capitals


def text(*shape, seed=0):
    return TEXT[torch.randint(len(TEXT), shape, generator=torch.Generator().manual_seed(seed))]


def rows_with_passkeys(seed, share=0.5, B=64, T=40):
    x = text(B, T + 1)
    return x, Passkeys(TOK).insert(x, share, seed)


def test_insert_is_deterministic_and_every_answer_is_checkable():
    x, (px, py) = rows_with_passkeys(seed=7)
    again = rows_with_passkeys(seed=7)[1]
    assert torch.equal(px, again[0]) and torch.equal(py, again[1])
    assert not torch.equal(px, rows_with_passkeys(seed=8)[1][0])
    marker, k = TOK.encode(MARKER)[0], KEY_LEN
    changed = 0
    for row, src, target in zip(torch.cat((px, py[:, -1:].clamp(min=0)), 1), x, py):
        at = (row == marker).nonzero().flatten().tolist()
        if not at:
            assert torch.equal(row, src) and (target >= 0).all()  # untouched, every target trained
            continue
        changed += 1
        first, question = at
        key = row[first + 1:first + 1 + k]
        assert question - first >= k + 1 and TOK.decode(key.tolist()).isupper() and len(key) == k
        # the answer is the first key, and it is trained; the unpredictable tokens are not
        assert torch.equal(target[question:question + k], key)
        ignored = (target == -1).nonzero().flatten().tolist()
        assert ignored == [*range(first - 1, first + k), question - 1] if first else ignored == [*range(k), question - 1]
        outside = [i for i in range(len(row)) if not (first <= i <= first + k or question <= i <= question + k)]
        assert torch.equal(row[outside], src[outside])  # the text around is the batch's own
    assert 20 < changed < 44  # about half of 64 rows


class Oracle(torch.nn.Module):
    """Retrieval itself: after the second marker, all the mass on the token as far after the first one."""

    def forward(self, idx, targets):
        B, T = idx.shape
        logits = torch.zeros(B, T, len(TOK.chars))
        marker = TOK.encode(MARKER)[0]
        for b in range(B):
            first, question = (idx[b] == marker).nonzero().flatten().tolist()
            for t in range(question, T):
                logits[b, t, idx[b, first + 1 + t - question]] = 1.0
        return logits, None


class Blind(torch.nn.Module):
    def forward(self, idx, targets):
        return torch.zeros(*idx.shape, len(TOK.chars)).index_fill_(-1, torch.tensor(TOK.encode("A")), 1.0), None


class Batches:
    """Fixed windows of lower-case text, as data.loader.Batches' evaluation yields them."""

    def __init__(self, W, n=12):
        self.rows = text(n, W + 1, seed=1)

    def eval_batches(self, split):
        for chunk in self.rows.split(5):
            yield chunk[:, :-1], chunk[:, 1:]


def test_the_probe_scores_retrieval_as_one_and_a_blind_guess_as_chance():
    from runtime import Runtime
    rt = Runtime("cpu", torch.float32, compile=False)
    pk = Passkeys(TOK)
    assert pk.accuracy(Oracle(), Batches(20), rt) == {"key": 1.0, "token": 1.0}
    blind = pk.accuracy(Blind(), Batches(20), rt)  # always "A": no key is "AAAA", some hold an A
    keys = Passkeys(TOK).keys(12, torch.Generator().manual_seed(4321))  # the probe's keys, drawn as it draws them
    assert blind == {"key": 0.0, "token": (keys == TOK.encode("A")[0]).sum().item() / keys.numel()} and blind["token"] > 0
    assert pk.accuracy(Oracle(), Batches(20), rt) == pk.accuracy(Oracle(), Batches(20), rt)


def test_a_vocabulary_without_the_marker_is_refused_in_one_line():
    import pytest
    with pytest.raises(ValueError, match=r"needs '\$' as one token") as e:
        Passkeys(CharTokenizer(list("abc")))
    assert "\n" not in str(e.value)
