"""Associative recall at distance: the retrieval task of the context-extension lab, learnable by a small model.

A task row is low-entropy filler (". " repeated, as the passkey tests of Landmark Attention and YaRN pad with
one sentence) holding `pairs` needles k V W at random places that do not overlap, k a lower-case letter and V, W
capitals, then `queries` queries, ending at a random place in the row (filler after): multi-query associative
recall (Arora et al. 2023, "Zoology"). A row holds `pairs` needles, or a number drawn uniformly from
`fewest` to `pairs` (so that the rows ask every query slot and needle count a probe of `pairs` needles asks,
while most are shorter). A query is the key of a needle drawn uniformly, with replacement, from
the row's needles, and its answer is that needle's V W. Keys are distinct in a row and so are all the capitals,
and the filler has no letters, so each answer is one lookup of a token seen once before: the induction a small
transformer learns first. Because each query draws its needle afresh, the needles asked before tell nothing of
the next one: without reading the key every needle is equally likely, and no elimination ("the capitals not
yet repeated") can answer it. A share of the training rows are task rows, the rest text, so the language-model
loss stays comparable across models; of a task row only the answers are trained.

Probe windows (synthetic, filler and needles; no dataset) are written here and scored by lab/retrieval.py:

- `block_windows`: contexts of filler and one block of `pairs` needles side by side, each needle asked by a query
  of its own at the end of a window of W tokens (lab/retrieval.py scores a context's queries on one forward of it).
  A query sees its context alone, never another query: no earlier answer to copy, no needle eliminated. The block
  starts at every place it fits, so each slot of it is asked at every distance the slot allows, equally often; the
  probe groups distances into cells. Where the needles stand together, a model that reads no key and copies a
  needle by its recency rank, by its place in the window or by an edge of the window picks among all of them: its
  best score in a cell (the floor, counted exactly on the windows by lab/retrieval.py) stays near chance, 1 time in
  `pairs` (`chance`), where the cell spans distances every slot reaches. (Needles scattered through the window, as
  the training rows hold them, leave few ranks near the query and one place for each distance: a copier of the
  latest needle, or of the needle nearest a fixed place, then scores far above chance in some cells.)
- `slot_windows`: the needles, then every needle queried once in a random order (earlier answers shown):
  elimination answers query j of `pairs` right 1 time in pairs - j + 1, the last always; a model that reads the
  keys scores alike at every slot. The shortcut check of a trained model.
"""

import torch

from config import POSITIVE, opt

KEYS, VALUES, FILLER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", ". "
NEEDLE = 3  # tokens of a needle or a query: the key and the two answer tokens
# the probe windows' layout and what a scored cell records of it: a lab score made under another is made again
LAYOUT = 4


def query_keys(end, queries):
    """Positions of the keys of `queries` queries that follow one another and end at `end`."""
    return [end - NEEDLE * (queries - j) for j in range(queries)]


class Recall:
    """The task's token ids in one vocabulary; writes task rows and probe windows. As a training task (data/batches.py's
    `recall`) it declares its settings, which a run takes as flat keys."""

    settings = {
        "recall_share": (
            float,
            opt(0.75, "share of training sequences that carry the task", check=("lie in (0, 1]", lambda v: 0 < v <= 1)),
        ),
        "recall_pairs": (
            int,
            opt(
                4,
                "needles in a sequence that carries the task",
                check=(
                    "lie in [1, 13]: each needle has a key letter and two capitals of its own",
                    lambda v: 1 <= v <= 13,
                ),
            ),
        ),
        "recall_queries": (
            int | None,
            opt(
                None,
                "queries at the end of a task sequence, each a needle drawn with replacement (default recall_pairs)",
                check=POSITIVE,
            ),
        ),
        "recall_fewest": (
            int | None,
            opt(
                None,
                "fewest needles in a task sequence: each draws its count from recall_fewest to recall_pairs, so that "
                "rows ask every slot a probe of recall_pairs needles asks (default recall_pairs: every row holds that "
                "many)",
                check=POSITIVE,
            ),
        ),
    }

    @staticmethod
    def check(batch_cfg):
        """The rules between the task's settings (batch_cfg, a data.batches.BatchConfig with them)."""
        if batch_cfg.recall_fewest is not None and batch_cfg.recall_fewest > batch_cfg.recall_pairs:
            raise ValueError(
                f"recall_fewest={batch_cfg.recall_fewest} must lie in [1, recall_pairs={batch_cfg.recall_pairs}]"
            )

    @classmethod
    def writer(cls, batch_cfg, tokenizer, block_size):
        """(the task as batch_cfg sets it, the share of training rows it writes); a block too short for it fails now."""
        task = cls(tokenizer, batch_cfg.recall_pairs, batch_cfg.recall_queries, batch_cfg.recall_fewest)
        task.insert(torch.zeros(1, block_size + 1, dtype=torch.long), 1.0, 0)
        return task, batch_cfg.recall_share

    def __init__(self, tokenizer, pairs=4, queries=None, fewest=None):
        """pairs needles a row, or from fewest to pairs (default pairs) drawn per row; queries at its end (default
        as many as the row's needles)."""
        ids = []
        for ch in KEYS + VALUES + FILLER:
            try:
                enc = tokenizer.encode(ch)
            except ValueError:  # a char vocabulary without it
                enc = []
            if len(enc) != 1:
                raise ValueError(
                    f"the recall task needs {ch!r} as one token, but the {tokenizer.name} tokenizer "
                    f"encodes it as {enc}; use a dataset whose vocabulary has a-z, A-Z, '.' and ' '"
                )
            ids += enc
        self.keys, self.values, self.filler = (torch.tensor(ids[:26]), torch.tensor(ids[26:52]), torch.tensor(ids[52:]))
        if not 1 <= pairs <= 13:
            raise ValueError(
                f"recall_pairs={pairs} must lie in [1, 13]: each needle has a key letter and two capitals of its own"
            )
        fewest = pairs if fewest is None else fewest
        # an invariant, not a user's error: recall_fewest comes from a run's settings alone, which `check` refuses at
        # parse time (lab/retrieval.py's probes pass none)
        assert 1 <= fewest <= pairs, f"recall_fewest={fewest} must lie in [1, recall_pairs={pairs}]"
        if queries is not None and queries < 1:
            raise ValueError(f"recall_queries={queries} must be a positive integer")
        self.pairs, self.fewest, self.fixed_queries = pairs, fewest, queries

    @property
    def queries(self):
        """The most queries a row asks: its needles' number unless fixed."""
        return self.pairs if self.fixed_queries is None else self.fixed_queries

    @property
    def chance(self):
        """Whole answers of a model that copies one of the window's needles at random without reading the query's
        key. Not the floor of a distance cell: a copier of a fixed rank or place scores the share of the cell's
        queries that ask it, which lab/retrieval.py counts and holds to at most twice this."""
        return 1 / self.pairs

    def needles(self, n, generator):
        """(n, pairs, NEEDLE) needles: within each row the keys are distinct and so are all the capitals, so every
        answer token follows one earlier token alone."""
        keys = torch.rand(n, 26, generator=generator).argsort(-1)[:, : self.pairs]  # (n, pairs)
        values = torch.rand(n, 26, generator=generator).argsort(-1)[:, : 2 * self.pairs]  # (n, 2 pairs)
        values = values.view(n, self.pairs, 2)  # (n, pairs, 2)
        return torch.cat((self.keys[keys][..., None], self.values[values]), -1)  # (n, pairs, 3)

    def row(self, length, needles, starts, queries, end):
        """A task row of length tokens: filler, the needles (pairs, 3) at starts, and the queries (q, 3) ending at
        end."""
        out = self.filler.repeat(length // len(self.filler) + 1)[:length].clone()
        for needle, a in zip(needles, starts.tolist(), strict=True):
            out[a : a + NEEDLE] = needle
        out[end - NEEDLE * len(queries) : end] = queries.flatten()
        return out

    @staticmethod
    def places(n, room, k, generator):
        """(n, k) sorted starts of k needles that do not overlap, uniform over the ways to place them within room
        tokens: sorted distinct picks among the free tokens and k, spread by a needle's length."""
        free = room - k * NEEDLE
        assert free >= 0, f"{k} needles cannot fit in {room} tokens"
        picks = torch.rand(n, free + k, generator=generator).argsort(-1)[:, :k].sort(-1).values
        return picks + (NEEDLE - 1) * torch.arange(k)

    def insert(self, rows, share, seed):
        """(x, y) of rows (B, T+1) of tokens (on the CPU) with about share of them made task rows, drawn from seed;
        a task row's targets are its answers alone (-1 elsewhere). rows is not modified."""
        B, T = rows.shape[0], rows.shape[1] - 1
        shortest = (self.pairs + self.queries) * NEEDLE
        if T + 1 < shortest:
            raise ValueError(
                f"block_size={T} cannot hold {self.pairs} needles and their queries ({shortest} tokens)"
                f"; use a longer block_size, fewer recall_pairs or fewer recall_queries"
            )
        g = torch.Generator().manual_seed(seed)
        chosen = (torch.rand(B, generator=g) < share).nonzero().flatten()
        n = len(chosen)
        # the task fills the first `length` tokens of its row, filler the rest: its queries end anywhere from the
        # shortest room for them to the row's end, so no position is where answers always are
        lengths = torch.randint(shortest, T + 2, (n,), generator=g)
        needles = self.needles(n, g)
        counts, asked = self.asked(n, g)
        rows, trained = rows.clone(), torch.ones_like(rows, dtype=torch.bool)
        # python ints, listed once: no .item() per row, and each row's queries decided here rather than in the loop
        counts = counts.tolist()
        queries = counts if self.fixed_queries is None else [self.fixed_queries] * n
        for r, (i, length, c, q) in enumerate(zip(chosen.tolist(), lengths.tolist(), counts, queries, strict=True)):
            starts = self.places(1, length - q * NEEDLE, c, g)[0]
            rows[i] = self.row(T + 1, needles[r, :c], starts, needles[r, asked[r, :q]], length)
            trained[i] = False
            trained[i, [key + d for key in query_keys(length, q) for d in (1, 2)]] = True  # each V and W
        return rows[:, :-1], rows[:, 1:].masked_fill(~trained[:, 1:], -1)

    def asked(self, n, generator):
        """(n,) needles of each task row and (n, queries) the needle each of its queries asks, uniform over the
        row's needles and with replacement: no elimination cue."""
        if self.fewest == self.pairs:  # the draws rows of a fixed size have always had: their batches stay the same
            return torch.full((n,), self.pairs), torch.randint(self.pairs, (n, self.queries), generator=generator)
        counts = torch.randint(self.fewest, self.pairs + 1, (n,), generator=generator)
        return counts, (torch.rand(n, self.queries, generator=generator) * counts[:, None]).long()

    def block_windows(self, W, repeats, generator, stride=1):
        """The distance probe's windows of W tokens: (contexts (n, W+1) rows, needles (n, pairs, 3), distances (n,
        pairs): each needle's key to the query's key, query_keys(W + 1, 1)). A context is filler and its needles side
        by side in one block, the last three tokens (the query's) filler too; a needle's query is the context with
        the needle's own three tokens in the query's place. The block starts at every `stride`-th place it fits,
        `repeats` times each (the needles drawn afresh), so that slot i of the block, whose recency rank is
        pairs - 1 - i, is asked at the distances it reaches equally often."""
        query, block = query_keys(W + 1, 1)[0], self.pairs * NEEDLE
        if query < block:
            raise ValueError(
                f"a probe window of W={W} tokens cannot hold a block of {self.pairs} needles before its query; "
                f"valid: W >= {block + NEEDLE - 1}"
            )
        starts = torch.arange(0, query - block + 1, stride).repeat(repeats)  # (n,)
        needles = self.needles(len(starts), generator)  # (n, pairs, 3)
        rows = self.filler.repeat((W + 1) // len(self.filler) + 1)[: W + 1].repeat(len(starts), 1)
        at = starts[:, None] + torch.arange(block)  # (n, block): the block's tokens
        rows.scatter_(1, at, needles.flatten(1))
        return rows, needles, query - (starts[:, None] + NEEDLE * torch.arange(self.pairs))

    def slot_windows(self, W, n, generator):
        """(n, W+1) probe rows: the pairs needles placed uniformly, then each queried once in a random order, the
        last query's answer ending the row (query_keys(W + 1, pairs) are the queries' keys)."""
        if W + 1 < 2 * self.pairs * NEEDLE:
            raise ValueError(
                f"a slot probe window of W={W} tokens cannot hold {self.pairs} needles and their "
                f"queries; valid: W >= {2 * self.pairs * NEEDLE - 1}"
            )
        needles = self.needles(n, generator)
        starts = self.places(n, W + 1 - self.pairs * NEEDLE, self.pairs, generator)  # (n, pairs)
        order = torch.rand(n, self.pairs, generator=generator).argsort(-1)  # (n, pairs): without replacement
        return torch.stack([self.row(W + 1, needles[b], starts[b], needles[b, order[b]], W + 1) for b in range(n)])
