"""The vectorised prompt lookup (serve/ngram.py) drafts exactly what the rule says, on random and repetitive token
sequences (its agreement with vLLM's own ngram proposer is the slow tier's: the reference decoder reproduces vLLM's
ngram counters)."""

import random

from draftsmith.serve.ngram import ngram_match


def by_the_rule(tokens, k, min_n=2, max_n=5):
    """The longest n (max_n down to min_n) whose tail occurred earlier, its leftmost occurrence, the k tokens after."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return [], 0
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        tail = tokens[total - n :]
        for i in range(0, total - n):
            if tokens[i : i + n] == tail:
                draft = tokens[i + n : i + n + k]
                return draft, (n if draft else 0)
    return [], 0


def test_the_vectorised_lookup_drafts_by_the_rule():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(rng.choice([1, 2, 3, 5, 50])) for _ in range(rng.randint(0, 60))]
        for k in (0, 1, 3):
            for lo, hi in ((2, 5), (1, 3), (3, 3), (1, 1), (4, 2)):
                assert ngram_match(tokens, k, lo, hi) == by_the_rule(tokens, k, lo, hi), (tokens, k, lo, hi)


def test_examples():
    assert ngram_match([7, 8, 9, 1, 7, 8], 3) == ([9, 1, 7], 2)
    assert ngram_match([1, 2, 3, 1, 2, 3, 4, 1, 2, 3], 2) == ([1, 2], 3)  # n=3 at its leftmost occurrence
    assert ngram_match([1, 2, 3, 4], 3) == ([], 0)
