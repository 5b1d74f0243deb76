"""Training-free drafters: ngram prompt lookup and suffix matching, as plain functions over token lists.

Both are deterministic: a proposal is a list of target token ids, and the verifier treats each as a
one-hot draft distribution (accept with probability p_target(token)).

* `ngram_propose` follows vLLM's `ngram` method: the longest n-gram (min_n <= n <= max_n) that ends the
  context and also occurs earlier; among equally long matches the earliest occurrence; propose the up
  to k tokens that followed it (fewer when the context ends first).
* `SuffixIndex` is our reading of suffix decoding (arctic-inference, vLLM `suffix`): the context and
  earlier outputs form a corpus; the longest suffix of the context found there (up to `max_depth`
  tokens) is extended greedily by the most frequent next token, while the running product of those
  frequencies stays >= `min_token_prob`, for at most min(k, max_spec_factor * match length) tokens.
  arctic-inference walks a suffix tree with the same scores; counts on ties may break differently,
  so its served τ is a neighbour of ours, not equal (the calibration table shows both).
"""

from __future__ import annotations

import math
from collections import Counter

from draftsmith.serve.ngram import ngram_match


def ngram_propose(tokens: list[int], k: int, min_n: int = 2, max_n: int = 5) -> list[int]:
    """Prompt lookup: the tokens that followed the earliest longest earlier match of the context's tail."""
    return ngram_match(tokens, k, min_n, max_n)[0]


class SuffixIndex:
    """Suffix matching over a growing corpus: the current request's tokens plus earlier requests' outputs."""

    def __init__(self, max_depth: int = 24, max_spec_factor: float = 1.0, min_token_prob: float = 0.1):
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.history: list[list[int]] = []  # earlier requests' outputs (the cross-request cache)
        self._where: dict[int, list[tuple[int, int]]] = {}  # token -> its (output, offset)s that have a follower

    def remember(self, output: list[int]) -> None:
        """Add a finished request's output to the corpus later requests draw on."""
        if output:
            s = len(self.history)
            self.history.append(list(output))
            for j, t in enumerate(output[:-1]):
                self._where.setdefault(t, []).append((s, j))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens continuing `tokens` (the request's prompt + output so far)."""
        return self.speculate(tokens, k)[0]

    def speculate(self, tokens: list[int], k: int) -> tuple[list[int], int, float]:
        """(draft, match length, score): the score is the sum of the drafted tokens' estimated probabilities
        (the running products of their frequencies), as arctic-inference scores a draft: the number of its
        tokens the corpus expects to be accepted."""
        if k <= 0 or len(tokens) < 2:
            return [], 0, 0.0
        seqs = [*self.history, tokens]
        # Occurrences are (sequence, end offset) of a match of the context's last n tokens that has a
        # follower; the current context's own tail (end = len - 1) never has one, so it never counts.
        last, cur = tokens[-1], len(self.history)
        cands = [*self._where.get(last, ()), *((cur, j) for j in range(len(tokens) - 1) if tokens[j] == last)]
        match_len = 1 if cands else 0
        while cands and match_len < min(self.max_depth, len(tokens) - 1):
            want = tokens[-1 - match_len]
            longer = [(s, j) for s, j in cands if j - match_len >= 0 and seqs[s][j - match_len] == want]
            if not longer:
                break
            cands, match_len = longer, match_len + 1
        budget = min(k, math.floor(self.max_spec_factor * match_len + 1e-9))
        out: list[int] = []
        prob, score = 1.0, 0.0
        while len(out) < budget and cands:
            counts = Counter(seqs[s][j + 1] for s, j in cands)
            tok, c = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))  # most frequent; ties -> lowest id
            prob *= c / len(cands)
            if prob < self.min_token_prob:
                break
            out.append(tok)
            score += prob
            # follow the occurrences that continued with `tok` and still have a follower
            cands = [(s, j + 1) for s, j in cands if seqs[s][j + 1] == tok and j + 2 < len(seqs[s])]
        return out, match_len, score
