"""Prompt lookup as vLLM's `ngram` method drafts: the hybrid drafter's n-gram member at serving time, and the
reference decoder's."""

from __future__ import annotations


def ngram_match(tokens: list[int], k: int, min_n: int = 2, max_n: int = 5) -> tuple[list[int], int]:
    """`ngram_propose`'s draft and the length n of the n-gram it matched (0 when it drafts nothing)."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return [], 0
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        tail = tokens[total - n :]
        # an earlier occurrence starts at i < total - n (the tail itself does not count)
        for i in range(0, total - n):
            if tokens[i : i + n] == tail:
                start = i + n
                draft = tokens[start : start + k]
                return draft, (n if draft else 0)
    return [], 0
