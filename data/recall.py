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

- `context_windows`: contexts of filler and `pairs` needles, each needle asked by a query of its own at the end of
  a window of W tokens, its key exactly k tokens before the query's, k one of the probed distances: each
  distance asked `trials` times, up to `pairs` of them a context (lab/retrieval.py scores a context's queries on
  one forward of it). A query sees its context alone, never another query: no earlier answer to copy from, no
  needle eliminated. (Queries following one another at a window's end, as the training rows ask them, would
  give back both: a needle asked again is answered by the earlier query's shown answer, a few tokens back, so
  such a query measures that distance and not its needle's; and the queries at long distances would then be
  the first asks alone, among which the needles already asked are never the answer.) A model that copies some
  needle's capitals without reading the key is right 1 time in `pairs` (`chance`); one that copies the needle
  of a fixed recency rank (how many needles lie between it and the query) is right as often as the queries at
  a distance ask that rank: the needle right before the query is always the latest (rank 0), the one at the
  window's start always the earliest, and near them few ranks fit. A cell's floor, the best score of any
  strategy that reads no key, is its largest rank share, counted exactly on the windows (context_windows'
  ranks), and the readout (lab/retrieval.py) reads a cell only above it; where one rank alone fits (`fits`) the
  layout forces the answer (floor 1): the readout keeps those cells apart (`forced`).
- `slot_windows`: the needles, then every needle queried once in a random order (earlier answers shown):
  elimination answers query j of `pairs` right 1 time in pairs - j + 1, the last always; a model that reads the
  keys scores alike at every slot. The shortcut check of a trained model.
"""

import torch

from config import POSITIVE, opt

KEYS, VALUES, FILLER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", ". "
NEEDLE = 3  # tokens of a needle or a query: the key and the two answer tokens
# the probe windows' layout and what a scored cell records of it: a lab score made under another is made again
LAYOUT = 3


def query_keys(end, queries):
    """Positions of the keys of `queries` queries that follow one another and end at `end`."""
    return [end - NEEDLE * (queries - j) for j in range(queries)]


def distances(W, n):
    """n needle-to-query distances (the query's key position minus the needle's key position) spread evenly from
    the shortest, NEEDLE (the needle right before the query), to the longest a window of W tokens allows (the
    needle at its start), rounded, distinct and sorted; every distance when the window has fewer than n."""
    low, high = NEEDLE, query_keys(W + 1, 1)[0]
    if n < 2 or high < low:
        raise ValueError(
            f"distances: n={n} must be >= 2 (the shortest and the longest) and a window of W={W} "
            f"tokens must hold a needle and its query (W >= {2 * NEEDLE - 1})"
        )
    return sorted({round(low + i * (high - low) / (n - 1)) for i in range(n)})


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
        key. Not the floor of a distance cell: copying the needle of a fixed recency rank scores the share of the
        cell's queries that ask that rank (context_windows' ranks), all of them right before the query."""
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

    def context_windows(self, W, ks, trials, generator):
        """The distance probe's windows of W tokens, every needle of a context asked: (contexts (n, W+1) rows,
        needles (n, pairs, 3), asked (n, pairs): the index in ks of the distance each needle is asked at, -1 where
        it is not asked, ranks (n, pairs): each needle's recency rank, how many needles lie between it and the
        query, by which a model copying the needle of a fixed rank without reading the key is right). A context is
        filler and its needles, the last three tokens (the query's) filler too; a needle asked at distance k has its
        key k tokens before the query's key (query_keys(W + 1, 1)), and its query is the context with the needle's
        own three tokens in the query's place. Each context asks up to pairs distances of ks at least a needle
        apart, drawn without replacement weighted by the asks each still needs, so that every distance is asked
        exactly `trials` times; a context that cannot take pairs of them holds needles asked at none, placed
        uniformly in the room left."""
        query = query_keys(W + 1, 1)[0]
        # each needle placed rules out 2 NEEDLE - 1 starts of another: room for the last wherever the others lie
        shortest = (2 * NEEDLE - 1) * (self.pairs - 1) + NEEDLE + 2
        if query - max(ks) < 0 or min(ks) < NEEDLE or W < shortest:
            raise ValueError(
                f"a probe window of W={W} tokens cannot hold {self.pairs} needles at distances {min(ks)} to "
                f"{max(ks)} from its query; valid: distances in [{NEEDLE}, {query}] and W >= {shortest}"
            )
        left, chosen = torch.full((len(ks),), trials, dtype=torch.float), []
        while left.sum():
            order = torch.multinomial(left, int((left > 0).sum()), replacement=False, generator=generator).tolist()
            picks = []
            for i in order:  # the first pairs that fit beside those picked: needles do not overlap
                if len(picks) < self.pairs and all(abs(ks[i] - ks[j]) >= NEEDLE for j in picks):
                    picks.append(i)
            left[picks] -= 1
            chosen.append(picks)
        needles = self.needles(len(chosen), generator)
        asked, starts = torch.full((len(chosen), self.pairs), -1), []
        for b, picks in enumerate(chosen):
            asked[b, : len(picks)] = torch.tensor(picks)
            at = [query - ks[i] for i in picks]
            while len(at) < self.pairs:  # needles asked at no distance: anywhere no other needle or query is
                free = [a for a in range(query - NEEDLE + 1) if all(abs(a - other) >= NEEDLE for other in at)]
                at.append(free[int(torch.randint(len(free), (1,), generator=generator))])
            starts.append(at)
        starts = torch.tensor(starts)  # (n, pairs)
        rows = torch.stack([self.row(W + 1, needles[b], starts[b], needles[b, :0], W + 1) for b in range(len(starts))])
        ranks = (starts[:, None, :] > starts[:, :, None]).sum(-1)  # (n, pairs): the needles after each
        return rows, needles, asked, ranks

    def fits(self, W, k):
        """The recency ranks a needle asked at distance k in a window of W tokens can have: how many of the other
        needles fit between it and its query, the rest before it. One alone: the layout forces the answer."""
        gap, before, others = k - NEEDLE, query_keys(W + 1, 1)[0] - k, self.pairs - 1
        return range(max(0, others - before // NEEDLE), min(others, gap // NEEDLE) + 1)

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
