"""Byte-level BPE training, what `python -m data.prepare --tokenizer bpe` runs: the merges learned from a corpus's
pre-tokenised pieces, and a slow reference encoder that checks tiktoken encodes with them as they were learned. A
run loads the result through data/tokenizer.py (the ranks file, run by tiktoken) and never imports this module.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict

import regex  # installed with tiktoken, which needs it; unlike re it knows \p{L}
from tqdm import tqdm

from data.tokenizer import GPT2_PATTERN


def pretokenize(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """Split text into the pieces BPE works within (merges never cross a piece boundary)."""
    return regex.findall(pattern, text)


def train_bpe(
    text: str, vocab_size: int, pattern: str = GPT2_PATTERN, progress: bool = True
) -> tuple[dict[bytes, int], list[tuple[int, int, int]]]:
    """Train a byte-level BPE: ids 0..255 are the bytes, each merge adds the most frequent
    adjacent pair (ties: smallest (left id, right id)), until vocab_size ids or no pairs left.

    Returns (ranks, merges): ranks maps token bytes to id (tiktoken's mergeable_ranks, id =
    rank = merge order); merges lists (left, right, new) in training order.
    """
    return train_bpe_from_counts(Counter(pretokenize(text, pattern)), vocab_size, progress)


def train_bpe_from_counts(
    piece_counts: Counter, vocab_size: int, progress: bool = True
) -> tuple[dict[bytes, int], list[tuple[int, int, int]]]:
    """train_bpe on the counts of the pre-tokenised pieces, which a corpus too large to hold can
    be counted into chunk by chunk. The result does not depend on the order of the pieces."""
    assert vocab_size > 256, f"vocab_size must exceed the 256 byte tokens, got {vocab_size}"
    # Work on unique pieces with their frequencies: far fewer than the corpus's pieces.
    words = [list(piece.encode("utf-8")) for piece in piece_counts]  # each a list of token ids
    freqs = list(piece_counts.values())

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    pair_words: dict[tuple[int, int], set[int]] = defaultdict(set)  # which words hold the pair
    for w, (word, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in itertools.pairwise(word):
            pair_counts[pair] += freq
            pair_words[pair].add(w)
    # Max-heap by count with lazy deletion: an entry is live only while its count is current.
    heap = [(-count, a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)

    vocab = [bytes([i]) for i in range(256)]
    ranks = {tok: i for i, tok in enumerate(vocab)}
    merges: list[tuple[int, int, int]] = []
    bar = tqdm(total=vocab_size - 256, desc="bpe merges", unit="merge", disable=not progress)
    while len(vocab) < vocab_size and heap:
        neg_count, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b)) != -neg_count:
            continue  # stale entry
        token = vocab[a] + vocab[b]
        # Two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"); tiktoken keys
        # tokens by bytes, so the later pair merges into the existing token.
        new = ranks.get(token)
        if new is None:
            new = len(vocab)
            vocab.append(token)
            ranks[token] = new
            bar.update(1)
        merges.append((a, b, new))
        _apply_merge(a, b, new, words, freqs, pair_counts, pair_words, heap)
    bar.close()
    return ranks, merges


def _apply_merge(a, b, new, words, freqs, pair_counts, pair_words, heap) -> None:
    """Merge pair (a, b) into `new` in every word holding it, updating only those words' pairs."""
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for w in pair_words.pop((a, b)):
        old, freq = words[w], freqs[w]
        merged = _merge_pair(old, a, b, new)
        old_pairs, new_pairs = list(itertools.pairwise(old)), list(itertools.pairwise(merged))
        for pair in old_pairs:
            delta[pair] -= freq
        for pair in new_pairs:
            delta[pair] += freq
        for pair in set(old_pairs) - set(new_pairs):
            if pair != (a, b):
                pair_words[pair].discard(w)
        for pair in set(new_pairs) - set(old_pairs):
            pair_words[pair].add(w)
        words[w] = merged
    for pair, d in delta.items():
        if d == 0:
            continue
        count = pair_counts[pair] + d
        if count > 0:
            pair_counts[pair] = count
            heapq.heappush(heap, (-count, *pair))
        else:
            assert count == 0, f"negative count {count} for pair {pair}"
            del pair_counts[pair]
            pair_words.pop(pair, None)


def _merge_pair(ids: list[int], a: int, b: int, new: int) -> list[int]:
    """Replace each non-overlapping (a, b), left to right, by `new`."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def encode_with_merges(text: str, merges: list[tuple[int, int, int]], pattern: str = GPT2_PATTERN) -> list[int]:
    """Reference encoder: in each piece apply the earliest learned merge present, repeatedly.
    Slow; used to check that tiktoken, which merges by rank, gives the same ids."""
    priority = {}
    for order, (a, b, new) in enumerate(merges):
        priority.setdefault((a, b), (order, new))
    out = []
    for piece in pretokenize(text, pattern):
        ids = list(piece.encode("utf-8"))
        while len(ids) > 1:
            found = [priority[p] for p in itertools.pairwise(ids) if p in priority]
            if not found:
                break
            order, new = min(found)
            a, b, _ = merges[order]
            ids = _merge_pair(ids, a, b, new)
        out.extend(ids)
    return out
