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

- `distance_windows`: the asked needle's key exactly k tokens before the single query's key at the window's
  end, the other needles before the query. A model that copies some needle's capitals without reading the key
  is right 1 time in `pairs` (`chance`). The asked needle's recency rank (how many other needles lie between it
  and the query) is drawn among the ranks the distance leaves room for (`ranks`), the latest and the earliest
  needle each asked 1 time in pairs, as when every rank fits: a model that copies the latest needle (or the
  first) is right at most as often as chance at every distance. With the other needles placed uniformly
  instead, the latest needle would be the asked one most of the time at every distance short against the
  window, and a model that never reads a key would seem to retrieve there. A model that copies the needle of
  another fixed rank is right as often as that rank is asked, up to 9 times in 10 where two ranks fit: a cell's
  floor, the best score of any strategy that reads no key, is its largest rank probability (exact, from
  `layout`), and the readout (lab/retrieval.py) reads a cell only above it. Where a single rank fits (the
  shortest distances, and the longest, the asked needle at the window's start) the layout forces the answer
  (floor 1): the readout keeps those cells apart (`forced`).
- `slot_windows`: the needles, then every needle queried once in a random order (earlier answers shown):
  elimination answers query j of `pairs` right 1 time in pairs - j + 1, the last always; a model that reads the
  keys scores alike at every slot. The shortcut check of a trained model.
"""

import torch

KEYS, VALUES, FILLER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", ". "
NEEDLE = 3  # tokens of a needle or a query: the key and the two answer tokens
# the probe windows' layout and what a scored cell records of it: a lab score made under another is made again
LAYOUT = 2


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
    """The task's token ids in one vocabulary; writes task rows and probe windows."""

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
        # an invariant, not a user's error: recall_fewest comes from BatchConfig alone, which refuses it at parse time
        # (lab/retrieval.py's probes pass none)
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
        key. Not the floor of a distance cell: copying the needle of a fixed recency rank scores `ranks`'s
        probability of that rank, up to 9 in 10 where two ranks fit."""
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
        for needle, a in zip(needles, starts.tolist()):
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
        for r, (i, length, c, q) in enumerate(zip(chosen.tolist(), lengths.tolist(), counts, queries)):
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

    def ranks(self, W, k):
        """{r: probability} of the asked needle's recency rank r (other needles between it and the query) in a
        distance window of W tokens at distance k: the latest (r = 0) and the earliest (r = pairs - 1) needle each
        1 / pairs where they fit beside another rank, the rest shared evenly by the ranks between; {r: 1.0} where
        one rank alone fits (the layout forces the answer)."""
        return self.layout(W, k)[2]

    def layout(self, W, k):
        """(at, others, ranks) of a distance window of W tokens at distance k: the asked needle's key position, the
        number of other needles, and `ranks`'s {r: probability}; distance_windows places the needles by all three."""
        query = query_keys(W + 1, 1)[0]
        at = query - k  # the asked needle's key
        gap, before, others = k - NEEDLE, at, self.pairs - 1  # free tokens after the needle and before it
        fits = list(range(max(0, others - before // NEEDLE), min(others, gap // NEEDLE) + 1))
        if at < 0 or gap < 0 or not fits:
            raise ValueError(
                f"a probe window of W={W} tokens cannot hold {self.pairs} needles with the asked one "
                f"k={k} tokens before its query; valid: k in [{NEEDLE}, {query}] and W >= "
                f"{NEEDLE * self.pairs + 2 * NEEDLE - 1} (room for every split of the others)"
            )
        if len(fits) == 1:
            return at, others, {fits[0]: 1.0}
        ends = [r for r in fits if r in (0, others)]
        middle = [r for r in fits if r not in ends]
        return (
            at,
            others,
            {r: 1 / self.pairs if r in ends else (1 - len(ends) / self.pairs) / len(middle) for r in fits},
        )

    def distance_windows(self, W, k, n, generator):
        """(n, W+1) probe rows: x = rows[:, :-1] is a window of W tokens ending in a query whose key sits k tokens
        after its needle's key; its answer is the row's last two tokens. The other pairs - 1 needles lie before the
        query, r of them between the asked needle and the query, r drawn as `ranks` says; each side's needles are
        placed uniformly."""
        at, others, ranks = self.layout(W, k)  # computed once, as ranks computes them
        drawn = torch.multinomial(torch.tensor(list(ranks.values())), n, replacement=True, generator=generator)
        needles, rows = self.needles(n, generator), []  # the first needle is asked
        for b, r in enumerate(torch.tensor(list(ranks))[drawn].tolist()):
            starts = torch.cat(
                (
                    torch.tensor([at]),
                    self.places(1, at, others - r, generator)[0],
                    at + NEEDLE + self.places(1, k - NEEDLE, r, generator)[0],
                )
            )
            rows.append(self.row(W + 1, needles[b], starts, needles[b, :1], W + 1))
        return torch.stack(rows)  # (n, W+1)

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
