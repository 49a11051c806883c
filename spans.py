"""Where one forward's tokens sit: the positions the schemes read and the keys the attention mask lets them see.

A plain forward's queries and keys are the same T tokens at 0..T-1; decoding past a KV cache (generate.py), PoSE's
skipped ids and a static-shape decoding step place them otherwise. The model builds a `Span` for each forward and the
schemes read positions from it alone, never asking which case they are in.
"""

import torch


class Span:
    """Where one forward's T queries sit and which S keys they attend to: what the schemes and the attention mask
    read of positions.

    Tokens have an index (their place in the sequence, which alone decides causality) and a position (what the
    schemes encode). By default they are the same, shared by every row: `ids` (T,), `key_ids` (S,). A batch may
    give each row positions of its own (PoSE's skipped ids, packed documents), increasing along the row: then
    `ids` is (B, T) and `key_ids` (B, S), and every position-dependent tensor a scheme builds gets a head axis
    (`heads`) to broadcast over (B, nh, T, S).

    Without a cache or with a dynamic one, `start` is an int and the keys end at the last query (S = T without a
    cache; the cached keys and the T new ones with it). In a static-shape decoding step (generate.StaticKVCache,
    for CUDA graphs) `start` is a 0-dim tensor that no host code may read, and the keys are the cache's S fixed
    slots 0..S-1, those past the last query not written yet, which `visible` marks as the future like any later
    key. This class alone tells the cases apart."""

    def __init__(self, start, length, keys, device, ids=None, key_ids=None):
        self.start, self.length, self.keys, self.device = start, length, keys, device
        self.static = torch.is_tensor(start)
        if self.static:
            self.index = start + torch.arange(length, device=device)  # (T,)
            self.key_index, self.end = torch.arange(keys, device=device), keys  # every slot: a table must reach it
        else:
            if start < 0:
                raise ValueError(f"start position {start} must be >= 0")
            self.index = torch.arange(start, start + length, device=device)  # (T,)
            self.key_index = torch.arange(start + length - keys, start + length, device=device)  # (S,)
            self.end = start + length  # the positions lie below it, known on the host
        self.per_row = ids is not None
        if self.per_row:
            self.ids, self.key_ids = ids, ids if key_ids is None else key_ids  # (B, T), (B, S)
            self.end = int(self.key_ids.max()) + 1  # the tables must reach the largest position
        else:
            self.ids, self.key_ids = self.index, self.key_index

    def heads(self, t):
        """t, built per row (B, T, ...), with a head axis (B, 1, T, ...); a shared one (T, ...) as it is."""
        return t.unsqueeze(1) if self.per_row else t

    def distances(self):
        """(T, S), or (B, 1, T, S) per row: query position minus key position, >= 0 where the key is visible."""
        return self.heads(self.ids[..., :, None] - self.key_ids[..., None, :])

    def visible(self):
        """(T, S) bools: the keys at or before each query in the sequence (causality by index, not position)."""
        return self.key_index[None, :] <= self.index[:, None]

    def attention_mask(self, window=None):
        """(mask, is_causal) for scaled_dot_product_attention where no scheme bias carries the causal mask; with a
        window, each query sees only the keys less than `window` positions back (sliding-window attention).
        Branches rather than is_causal=(T > 1): under torch.compile with dynamic shapes that is a symbolic bool,
        which scaled_dot_product_attention refuses (a graph break)."""
        if window is not None and (window < self.keys or self.per_row):
            return self.visible() & (self.distances() < window), False  # (T, S) or (B, 1, T, S)
        if not self.static and self.length == 1:
            return None, False  # a lone new token may see every key
        if not self.static and self.keys == self.length:
            return None, True  # queries and keys the same tokens: the triangle from the top left
        return self.visible(), False  # (T, S): new tokens after cached ones, or a static cache's slots
