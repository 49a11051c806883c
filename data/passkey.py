"""Passkey retrieval (Mohtashami & Jaggi 2023; the probe PI and YaRN report): can a model use a distant token?

A passkey is a marker followed by KEY_LEN random capital letters; further on the marker comes again, and the right
continuation is the same letters, which only the first occurrence can tell. Training writes passkeys into a share
of its sequences (`PasskeyBatches`), at random places and distances within the window, deterministically from the
batch's seed. Only the answer is trained: the first key and the two markers cannot be predicted, so their targets
are ignored. The probe (`Passkeys.accuracy`) writes the key at the start of fixed validation windows and the
question at their end, and counts the windows whose key comes back: every one of its KEY_LEN tokens the argmax
given the ones before, which is exactly when greedy decoding would produce it. It also scores each token of the
answer alone, a copy probe: an induction head copies the key's later letters once it has the first, so a model
that cannot find the key yet may still show copying above chance (1/26).
"""

import torch

from data.loader import PASSKEY, Batches, micro_seed

MARKER, LETTERS, KEY_LEN = "$", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", 4  # "$" occurs once in tiny Shakespeare
PROBE_SEED = 4321  # the probe's keys, the same for every model scored


class Passkeys:
    """The passkey's token ids in one vocabulary; writes passkeys into rows of tokens and scores a model on them."""

    def __init__(self, tokenizer, key_len=KEY_LEN):
        ids = []
        for ch in MARKER + LETTERS:
            try:
                enc = tokenizer.encode(ch)
            except ValueError:  # a char vocabulary without it
                enc = []
            if len(enc) != 1:
                raise ValueError(f"the passkey probe needs {ch!r} as one token, but the {tokenizer.name} tokenizer "
                                 f"encodes it as {enc}; use a dataset whose vocabulary has {MARKER!r} and A-Z")
            ids += enc
        self.marker, self.letters, self.key_len = ids[0], torch.tensor(ids[1:]), key_len

    def keys(self, n, generator):
        return self.letters[torch.randint(len(self.letters), (n, self.key_len), generator=generator)]  # (n, k)

    def write(self, rows, start, gap, keys):
        """In place: in each row i (tokens), the marker and keys[i] at start[i], again at start[i] + gap[i]."""
        k = self.key_len
        for row, a, q, key in zip(rows, start.tolist(), (start + gap).tolist(), keys):
            row[a], row[a + 1:a + 1 + k], row[q], row[q + 1:q + 1 + k] = self.marker, key, self.marker, key

    def insert(self, rows, share, seed):
        """(x, y) of rows (B, T+1) of tokens (on the CPU) with a passkey in about share of them, its gap (marker to
        marker) uniform in [key_len + 1, T - key_len], all drawn from seed; the targets of the unpredictable
        tokens are -1. rows is not modified."""
        B, T = rows.shape[0], rows.shape[1] - 1
        k, g = self.key_len, torch.Generator().manual_seed(seed)
        chosen = (torch.rand(B, generator=g) < share).nonzero().flatten()
        n = len(chosen)
        gap = torch.randint(k + 1, T - k + 1, (n,), generator=g)
        start = (torch.rand(n, generator=g) * (T - k - gap + 1)).long()  # the second key ends by the row's end
        rows, picked = rows.clone(), rows[chosen]
        self.write(picked, start, gap, self.keys(n, g))
        rows[chosen] = picked
        ignored = torch.zeros_like(rows, dtype=torch.bool)
        for i, a, q in zip(chosen.tolist(), start.tolist(), (start + gap).tolist()):
            ignored[i, a:a + k + 1] = ignored[i, q] = True  # the first marker and key, and the question's marker
        return rows[:, :-1], rows[:, 1:].masked_fill(ignored[:, 1:], -1)

    @torch.no_grad()
    def accuracy(self, model, batches, rt):
        """{"key": the share of batches' fixed validation windows (W tokens) whose key, written at the window's start
        with the question at its end (gap W - key_len), the model gives back; "token": the share of its tokens}."""
        g, k = torch.Generator().manual_seed(PROBE_SEED), self.key_len
        hits = tokens = n = 0
        for x, y in batches.eval_batches("val"):  # (B, W) each
            B, W = x.shape
            rows = torch.cat((x, y[:, -1:]), 1).cpu()  # (B, W+1)
            keys = self.keys(B, g)
            self.write(rows, torch.zeros(B, dtype=torch.long), torch.full((B,), W - k), keys)
            with rt.autocast():
                logits = model(rows[:, :-1].to(x.device), rows[:, 1:].to(x.device))[0]  # (B, W, vocab)
            right = logits[:, W - k:].argmax(-1).cpu() == keys  # (B, k)
            hits, tokens, n = hits + right.all(1).sum().item(), tokens + right.sum().item(), n + B
        return {"key": hits / n, "token": tokens / (n * k)}


class PasskeyBatches(Batches):
    """Batches whose training sequences carry passkeys in a share of rows, drawn by (seed, step, micro-step) like the
    batches themselves; the evaluation windows stay plain text."""

    def __init__(self, passkeys, share, dataset_dir, meta, block_size, *args):
        if block_size < 2 * passkeys.key_len + 1:
            raise ValueError(f"block_size={block_size} cannot hold a passkey and its answer "
                             f"(2 x {passkeys.key_len + 1} tokens); use a longer block_size or passkey_share=0")
        super().__init__(dataset_dir, meta, block_size, *args)
        self.passkeys, self.share = passkeys, share

    def mix(self, rows, step, micro):
        return self.passkeys.insert(rows, self.share, micro_seed(self.seed, step, micro, PASSKEY))
