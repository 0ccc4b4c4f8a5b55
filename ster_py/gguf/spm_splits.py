"""Every way to cut each token of a vocabulary into two tokens, found with array hashing.

A SentencePiece GGUF stores scores, not merges; its merge list is every split of a
token into two vocabulary tokens (``tokenizer._merges_from_scores`` ranks them). A
plain search slices each token at each point and looks both parts up in a dict,
about 1.2 million look-ups for Gemma 3's 262,144 tokens. Here the work is done on
numpy arrays: the vocabulary becomes one array of code points, every substring gets
a 64-bit polynomial hash in O(1) from running sums, the parts' hashes are looked up
among the tokens' hashes, and every hit is confirmed on the texts themselves, so a
hash collision can cost time but never a wrong merge. Tokens that share a hash (a
polynomial hash modulo 2**64 has crafted collisions for every base: two Thue-Morse
strings of 1,024 characters) all stay candidates, within a bound on the extra work.
Confirming a hit compares code points for short tokens and Python strings for long ones,
so the work follows the number of splits, not their total length squared.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import SterError

__all__ = ["hashed_splits"]

# An odd multiplier, so it has an inverse modulo 2**64 (all hash arithmetic wraps there).
_BASE = 0x100000001B3
_INVERSE = pow(_BASE, -1, 1 << 64)
#: Code points handled per batch: keeps the temporary arrays (~100 bytes each) in the CPU cache.
_BATCH = 1 << 18
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd; 2**64 / golden ratio (Fibonacci hashing)
#: A hash bucket fuller than this (only a crafted vocabulary) switches look-ups to binary search.
_MAX_BUCKET = 32
#: Candidates confirmed code point by code point per batch (bounds the temporaries, ~50 bytes each).
_COMPARE_BATCH = 1 << 20
#: Tokens longer than this are confirmed as Python strings (one C comparison per candidate).
_LONG = 48
#: Extra candidates that shared hashes may add in all, before the vocabulary is refused as crafted.
_MAX_EXTRA = 1 << 22


def hashed_splits(tokens: Sequence[str], lengths: np.ndarray, limit: int) -> np.ndarray | None:
    """Every (token id, cut, left id, right id) with ``tokens[left] + tokens[right] == tokens[id]``
    and ``len(tokens[left]) == cut``, grouped by token id, cuts ascending.

    Args:
        tokens: the vocabulary, distinct non-empty strings.
        lengths: int64 [len(tokens)], ``len`` of each token.
        limit: stop once more than this many rows are confirmed (the caller refuses such
            a table, so finishing it would be wasted work).

    Returns:
        int64 [rows, 4].

    Raises:
        SterError: tokens sharing hashes would add more than ``_MAX_EXTRA`` candidates (a
            crafted vocabulary; a real one has no two tokens with the same 64-bit hash).

    Source: the polynomial hash of ``s[i:j]`` is ``sum((s[k] + 1) * B**(j-1-k))``, which
    equals ``B**(j-1) * (G[j] - G[i])`` with ``G[k] = sum((s[t] + 1) * B**-t for t < k)``,
    all modulo 2**64 (B odd, so B**-1 exists).
    """
    n = len(tokens)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    # All code points, token after token. "surrogatepass": a lone surrogate (possible in a
    # str, never in text decoded from UTF-8) stays one code point, as len() counts it.
    flat = np.frombuffer("".join(tokens).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    # Token ranges of about _BATCH code points (a token never straddles two); the hash sums
    # are kept per range, so the temporaries stay small and in the CPU cache.
    ends = np.searchsorted(starts[1:], np.arange(_BATCH, len(flat) + _BATCH, _BATCH), "right")
    ranges = np.unique(np.concatenate([[0], ends, [n]])).tolist()
    ranges = list(zip(ranges[:-1], ranges[1:]))
    widest = max([int(starts[b] - starts[a]) for a, b in ranges], default=0)
    # Integer ufuncs wrap modulo 2**64, which is the arithmetic wanted here.
    power = _powers(_BASE, np.empty(widest + 1, dtype=np.uint64))  # B**k
    inverse = _powers(_INVERSE, np.empty(widest, dtype=np.uint64))  # B**-k
    running = np.empty(widest + 1, dtype=np.uint64)

    def hasher(first: int, last: int):
        """hash_of(i, j): the hashes of flat[i:j] for index arrays i < j inside tokens first..last-1."""
        base = int(starts[first])
        size = int(starts[last]) - base
        running[0] = 0
        # running[k] = sum((flat[base + t] + 1) * B**-t for t < k); code points stay below 0x110000
        np.multiply(inverse[:size], flat[base:base + size] + np.uint32(1), out=running[1:size + 1])
        np.cumsum(running[1:size + 1], out=running[1:size + 1])
        return lambda i, j: power[j - 1 - base] * (running[j - base] - running[i - base])

    keys = np.empty(n, dtype=np.uint64)
    for first, last in ranges:
        keys[first:last] = hasher(first, last)(starts[first:last], starts[first + 1:last + 1])
    find, expand = _finder(keys)
    out = [np.zeros((0, 4), dtype=np.int64)]
    count, extra = 0, [0]

    def candidates(group: np.ndarray, *rows: np.ndarray):
        """Rows repeated once per token of their hash group, and those tokens."""
        rep, ids = expand(group)
        extra[0] += len(ids) - len(group)
        if extra[0] > _MAX_EXTRA:
            raise SterError(f"the vocabulary holds many tokens with equal 64-bit hashes ({extra[0]}+ extra "
                            "split candidates); real vocabularies have none. The file is crafted; re-convert "
                            "the model")
        return (ids, *(r[rep] for r in rows)) if rep is not None else (ids, *rows)

    for first, last in ranges:
        hash_of = hasher(first, last)
        per = np.maximum(lengths[first:last] - 1, 0)  # splits of each token
        token = np.repeat(np.arange(first, last), per)
        # cut = 1, 2, ... within each token
        cut = np.arange(1, len(token) + 1) - np.repeat(np.cumsum(per) - per, per)
        begin = starts[token]
        middle = begin + cut
        group = find(hash_of(begin, middle))
        hit = np.flatnonzero(group >= 0)
        left, token, cut, begin, middle = candidates(group[hit], token[hit], cut[hit], begin[hit], middle[hit])
        ok = lengths[left] == cut
        token, cut, left, middle = token[ok], cut[ok], left[ok], middle[ok]
        group = find(hash_of(middle, starts[token + 1]))
        hit = np.flatnonzero(group >= 0)
        right, token, cut, left = candidates(group[hit], token[hit], cut[hit], left[hit])
        ok = lengths[right] == lengths[token] - cut
        token, cut, left, right = token[ok], cut[ok], left[ok], right[ok]
        ok = _spells(tokens, flat, starts, token, cut, left, right)
        out.append(np.stack([token[ok], cut[ok], left[ok], right[ok]], axis=1))
        count += int(ok.sum())
        if count > limit:
            break
    table = np.concatenate(out)
    if extra[0]:  # shared hashes: restore the order by token id, then cut
        table = table[np.lexsort((table[:, 1], table[:, 0]))]
    return table


def _spells(tokens: Sequence[str], flat: np.ndarray, starts: np.ndarray, token: np.ndarray, cut: np.ndarray,
            left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """bool [k]: whether token[i] is left[i]'s text then right[i]'s (their lengths already
    add up): a hash match is only a candidate. Short tokens are compared code point by code
    point in batches of ``_COMPARE_BATCH`` positions; long ones as Python strings, so memory
    stays bounded and time follows the candidates, whatever the tokens' lengths."""
    size = starts[token + 1] - starts[token]
    result = np.empty(len(token), dtype=bool)
    long = np.flatnonzero(size > _LONG)
    if len(long):
        result[long] = [tokens[t].startswith(tokens[a]) and tokens[t].endswith(tokens[b])
                        for t, a, b in zip(token[long].tolist(), left[long].tolist(), right[long].tolist())]
    short = np.flatnonzero(size <= _LONG)
    step = max(1, _COMPARE_BATCH // max(_LONG, 1))
    for at in range(0, len(short), step):
        pick = short[at:at + step]
        result[pick] = _spells_short(flat, starts, token[pick], cut[pick], left[pick], right[pick])
    return result


def _spells_short(flat, starts, token, cut, left, right) -> np.ndarray:
    size = starts[token + 1] - starts[token]
    ends = np.cumsum(size)
    owner = np.repeat(np.arange(len(token)), size)  # candidate of each compared position
    first = ends - size
    at = np.arange(len(owner)) - first[owner]  # position inside the token
    # Where each position's code point sits in the left part, or else in the right one.
    source = at + np.where(at < cut[owner], starts[left][owner], (starts[right] - cut)[owner])
    differs = flat[starts[token][owner] + at] != flat[source]
    return ~np.logical_or.reduceat(differs, first) if len(owner) else np.ones(len(token), dtype=bool)


def _powers(base: int, out: np.ndarray) -> np.ndarray:
    """Fill uint64 ``out`` with base**0, base**1, ... modulo 2**64; returns it."""
    out.fill(base)
    if len(out):
        out[0] = 1
        np.multiply.accumulate(out, out=out)
    return out


def _finder(keys: np.ndarray):
    """A look-up of hashes among ``keys`` (uint64 [n], one per token).

    Returns (find, expand): ``find`` maps a uint64 array of hashes to int64 group numbers
    (-1 where no token has that hash); ``expand(groups)`` gives (rep, ids): the token ids of
    each group, and for each id the index of its group in ``groups`` (rep is None when every
    group is one token, the normal case: ids then line up with ``groups``).

    Keys and queries are first multiplied by an odd constant (a bijection modulo 2**64)
    so that the top bits depend on every bit: a short token's polynomial hash is a small
    number. The distinct mixed keys are sorted, so the ones sharing their top bits (a bucket;
    about two buckets per key) are contiguous: a query scans ascending keys from its bucket's
    first one until it meets a key not below it, one or two steps where a binary search
    takes eighteen. An empty bucket's "first key" is the next bucket's, larger than the query.
    """
    keys = keys * _MIX
    order = np.argsort(keys, kind="stable")
    keys, group_start, group_size = np.unique(keys[order], return_index=True, return_counts=True)
    single = bool((group_size == 1).all())

    def expand(groups: np.ndarray):
        if single:
            return None, order[group_start[groups]]
        sizes = group_size[groups]
        rep = np.repeat(np.arange(len(groups)), sizes)
        within = np.arange(len(rep)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return rep, order[group_start[groups][rep] + within]

    # A sentinel after the last key ends every scan; it maps to no group.
    groups = np.append(np.arange(len(keys)), -1)
    keys = np.append(keys, np.uint64(2**64 - 1))
    bits = len(keys).bit_length() + 1
    shift = np.uint64(64 - bits)
    counts = np.bincount((keys[:-1] >> shift).astype(np.intp), minlength=1 << bits)
    bucket_start = np.zeros(len(counts), dtype=np.intp)
    np.cumsum(counts[:-1], out=bucket_start[1:])

    if counts.max() > _MAX_BUCKET:  # crafted keys: binary search keeps the cost O(log n)
        def find(query: np.ndarray) -> np.ndarray:
            query = query * _MIX
            pos = np.searchsorted(keys, query)
            return np.where(keys[pos] == query, groups[pos], -1)
        return find, expand

    def find(query: np.ndarray) -> np.ndarray:
        query = query * _MIX
        pos = bucket_start[(query >> shift).astype(np.intp)]
        key = keys[pos]
        found = np.where(key == query, groups[pos], -1)
        scan = np.flatnonzero(key < query)
        while len(scan):
            pos[scan] += 1
            key = keys[pos[scan]]
            hit = key == query[scan]
            found[scan[hit]] = groups[pos[scan[hit]]]
            scan = scan[key < query[scan]]
        return found

    return find, expand
