"""Associative recall at distance: the retrieval task of the context-extension lab, learnable by a small model.

A task row is low-entropy filler (". " repeated, as the passkey tests of Landmark Attention and YaRN pad with
one sentence) holding `pairs` needles k V W at random places, k a lower-case letter and V, W capitals, then the
same needles again in a random order, ending at a random place in the row (filler after): each repeat is a query whose answer (V W after its key)
only its needle can tell: multi-query associative recall (Arora et al. 2023, "Zoology"). Keys are distinct in a
row and so are the Vs, and the filler has no letters, so each answer is one lookup of a token seen once before:
the induction a small transformer learns first. A share of the training rows are task rows, the rest text, so
the language-model loss stays comparable across models; of a task row only the answers are trained.

The probe (`Recall.scores`) writes windows of W tokens as training writes its rows, the needle asked at a given
depth (0: the window's start, 1: just before the queries) among pairs - 1 others at random places, its query
the last, and scores whole answers (V and W both the argmax given the tokens before, exactly when greedy decoding would give
them) and the first answer token alone, chance-corrected: (accuracy - 1/26) / (1 - 1/26), 0 for guessing and 1
for always right.
"""

import torch

from data.loader import RECALL, Batches, micro_seed

KEYS, VALUES, FILLER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", ". "
NEEDLE = 3  # tokens of a needle or a query: the key and the two answer tokens
PROBE_SEED = 4321  # the probe's needles, the same for every model scored


class Recall:
    """The task's token ids in one vocabulary; writes task rows and scores a model on probe windows."""

    def __init__(self, tokenizer, pairs=4):
        ids = []
        for ch in KEYS + VALUES + FILLER:
            try:
                enc = tokenizer.encode(ch)
            except ValueError:  # a char vocabulary without it
                enc = []
            if len(enc) != 1:
                raise ValueError(f"the recall task needs {ch!r} as one token, but the {tokenizer.name} tokenizer "
                                 f"encodes it as {enc}; use a dataset whose vocabulary has a-z, A-Z, '.' and ' '")
            ids += enc
        self.keys, self.values, self.filler = (torch.tensor(ids[:26]), torch.tensor(ids[26:52]),
                                               torch.tensor(ids[52:]))
        if not 1 <= pairs <= 13:
            raise ValueError(f"recall_pairs={pairs} must lie in [1, 13]: each needle has a key letter and two capitals "
                             "of its own")
        self.pairs = pairs

    def needles(self, n, generator):
        """(n, pairs, NEEDLE) needles: within each row the keys are distinct and so are all the capitals, so every
        answer token follows one earlier token alone."""
        keys = torch.rand(n, 26, generator=generator).argsort(-1)[:, :self.pairs]  # (n, pairs)
        values = torch.rand(n, 26, generator=generator).argsort(-1)[:, :2 * self.pairs].view(n, self.pairs, 2)
        return torch.cat((self.keys[keys][..., None], self.values[values]), -1)  # (n, pairs, 3)

    def row(self, length, needles, starts, queries, end=None):
        """A task row of length tokens: filler, the needles (pairs, 3) at starts, and the queries (q, 3) ending at
        end (default: the row's end)."""
        out = self.filler.repeat(length // len(self.filler) + 1)[:length].clone()
        for needle, a in zip(needles, starts.tolist()):
            out[a:a + NEEDLE] = needle
        end = length if end is None else end
        out[end - NEEDLE * len(queries):end] = queries.flatten()
        return out

    @staticmethod
    def places(n, room, k, generator):
        """(n, k) starts of k needles that do not overlap, uniform over the ways to place them within the first
        room tokens: sorted distinct picks among the free tokens and k, spread by a needle's length."""
        free = room - k * NEEDLE
        picks = torch.rand(n, free + k, generator=generator).argsort(-1)[:, :k].sort(-1).values
        return picks + (NEEDLE - 1) * torch.arange(k)

    def around(self, at, last, generator):
        """Starts in [0, last] of the pairs - 1 needles beside one at `at`: uniform over the placements where no two
        overlap (drawn until one is such a placement)."""
        while True:
            starts = torch.randint(last + 1, (self.pairs - 1,), generator=generator).tolist()
            placed = sorted([at, *starts])
            if all(b - a >= NEEDLE for a, b in zip(placed, placed[1:])):
                return starts

    def insert(self, rows, share, seed):
        """(x, y) of rows (B, T+1) of tokens (on the CPU) with about share of them made task rows, drawn from seed;
        a task row's targets are its answers alone (-1 elsewhere). rows is not modified."""
        B, T = rows.shape[0], rows.shape[1] - 1
        if T + 1 < 2 * self.pairs * NEEDLE:
            raise ValueError(f"block_size={T} cannot hold {self.pairs} needles and their queries "
                             f"({2 * self.pairs * NEEDLE} tokens); use a longer block_size or fewer recall_pairs")
        g = torch.Generator().manual_seed(seed)
        chosen = (torch.rand(B, generator=g) < share).nonzero().flatten()
        n = len(chosen)
        # the task fills the first `length` tokens of its row, filler the rest: its queries end anywhere from the
        # shortest room for them to the row's end, so no position is where answers always are
        lengths = torch.randint(2 * self.pairs * NEEDLE, T + 2, (n,), generator=g)
        needles, order = self.needles(n, g), torch.rand(n, self.pairs, generator=g).argsort(-1)  # queries' order
        rows, trained = rows.clone(), torch.ones_like(rows, dtype=torch.bool)
        for r, i in enumerate(chosen.tolist()):
            length = lengths[r].item()
            starts = self.places(1, length - self.pairs * NEEDLE, self.pairs, g)[0]
            rows[i] = self.row(T + 1, needles[r], starts, needles[r, order[r]], end=length)
            trained[i] = False
            first = length - NEEDLE * self.pairs  # each query's V and W
            trained[i, [first + NEEDLE * j + d for j in range(self.pairs) for d in (1, 2)]] = True
        return rows[:, :-1], rows[:, 1:].masked_fill(~trained[:, 1:], -1)

    @torch.no_grad()
    def scores(self, model, batches, depth, rt):
        """{"answer": the share of probe windows (batches' fixed validation windows give their number and length W)
        whose needle, written at depth and asked at the window's end, comes back whole; "first": the first answer
        token's accuracy, chance-corrected}."""
        g, hits, firsts, n = torch.Generator().manual_seed(PROBE_SEED), 0, 0, 0
        for x, _ in batches.eval_batches("val"):  # (B, W): the windows' number and length
            B, W = x.shape
            last = W + 1 - (self.pairs + 1) * NEEDLE  # the last start before the queries, which fill the end
            at = round(depth * last)
            needles = self.needles(B, g)  # (B, pairs, 3): the first is asked, the others placed around it
            rows = torch.stack([self.row(W + 1, needles[b], torch.tensor([at, *self.around(at, last, g)]),
                                         needles[b, [*range(1, self.pairs), 0]]) for b in range(B)])  # (B, W+1)
            with rt.autocast():
                logits = model(rows[:, :-1].to(x.device), rows[:, 1:].to(x.device))[0]  # (B, W, vocab)
            guess = logits[:, W - 2:].argmax(-1).cpu()  # (B, 2): after the query's key, then after V
            right = guess == needles[:, 0, 1:]
            hits, firsts, n = hits + right.all(1).sum().item(), firsts + right[:, 0].sum().item(), n + B
        chance = 1 / len(self.values)
        return {"answer": hits / n, "first": (firsts / n - chance) / (1 - chance)}


class RecallBatches(Batches):
    """Batches whose training sequences are task rows in a share of rows, drawn by (seed, step, micro-step) like
    the batches themselves; the evaluation windows stay plain text."""

    def __init__(self, recall, share, dataset_dir, meta, block_size, *args):
        super().__init__(dataset_dir, meta, block_size, *args)
        self.recall, self.share = recall, share
        recall.insert(torch.zeros(1, block_size + 1, dtype=torch.long), 1.0, 0)  # a row too short fails now

    def mix(self, rows, step, micro):
        return self.recall.insert(rows, self.share, micro_seed(self.seed, step, micro, RECALL))
