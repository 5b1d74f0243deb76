"""The hybrid drafter's policy at serving time: each member's draft (`Proposal`) with its signal, the head's chain
score, and the policies fitted next to a head (`hybrid.json`) that choose among the drafts per request and step.

`draftsmith eval fit-hybrid` (eval/hybrid.py) fits them; the vLLM wrap (serve/hybrid.py) and the reference decoder
read them. Nothing here imports eval: eval depends on serve, never the reverse.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.atomic import atomic_write_json

if TYPE_CHECKING:
    import torch


@dataclass
class Proposal:
    tokens: list[int]  # draft target-token ids, at most k
    probs: torch.Tensor | None = None  # [len(tokens), V] the distributions they were drawn from; None = one-hot
    # how confident the drafter is, before verification (what a hybrid chooses on): a head's and suffix's
    # expected accepted tokens under their own model (sum of the running products of the drafted tokens'
    # probabilities), ngram's matched n-gram length; 0 for an empty draft, None when the drafter has none
    signal: float | None = None
    # a head's own probability of each token it drafted (signal = chain_score of them); None for the others
    confidences: list[float] | None = None


def chain_score(token_probs: list[float]) -> float:
    """Σ_j Π_{i<=j} p_i: the expected number of a chain's tokens accepted if each p_i were its acceptance
    probability given the ones before (arctic-inference's suffix score; a head's confidence in its draft)."""
    score, run = 0.0, 1.0
    for p in token_probs:
        run *= p
        score += run
    return score


POLICY_FILE = "hybrid.json"
ROLES = ("head", "ngram", "suffix")  # the policy's member roles; a matrix names the head by its own name
PREFERENCE = ("ngram", "suffix", "head")  # on equal expectations the cheaper draft


def prompt_key(ids: list[int]) -> str:
    """A short stable hash of a prompt's token ids (the policy lists those it was fitted on)."""
    return hashlib.sha1(json.dumps(list(map(int, ids))).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the policy


@dataclass
class Calibration:
    """One member's signal -> mean tokens accepted, in bins: bin i holds signals <= edges[i] (the last bin has
    no upper edge); non-decreasing in the signal."""

    edges: list[float]
    accepted: list[float]
    counts: list[int]

    def expect(self, signal: float) -> float:
        return self.accepted[min(bisect.bisect_left(self.edges, signal), len(self.accepted) - 1)]


@dataclass
class HybridPolicy:
    k: int
    members: dict[str, Calibration]  # role -> calibration
    fitted_on: dict = field(default_factory=dict)  # source, conversations, positions, prompt keys, figures
    # tokens the head drafts when it runs (its chain's passes); suffix and ngram still draft up to k. None = k.
    # The head's later positions are accepted rarely yet each costs a pass of its layer and draft LM head.
    head_depth: int | None = None
    # the sampling temperature of the answers it was fitted on (0: greedy); requests use the policy fitted nearest
    # their own temperature (HybridPolicies)
    temperature: float = 0.0

    @property
    def depth(self) -> int:
        return min(self.k, self.head_depth or self.k)

    def expected(self, role: str, proposal: Proposal) -> float:
        """The tokens the calibration expects to be accepted of this draft (an empty draft: -1, never chosen)."""
        return self.members[role].expect(proposal.signal or 0.0) if proposal.tokens else -1.0

    def choose(self, proposals: dict[str, Proposal]) -> str:
        """The role whose draft the calibration expects to be accepted furthest; ties go to the cheaper one."""
        return max(
            PREFERENCE,
            key=lambda r: (self.expected(r, proposals[r]), -PREFERENCE.index(r)) if r in proposals else (-2.0, 0),
        )

    def head_can_win(self, free: dict[str, Proposal]) -> bool:
        """Whether any head draft could still be chosen beside these training-free drafts: the head's best bin
        beats their best expectation (a tie goes to them). When it cannot, the head's chain need not be run."""
        best = max((self.expected(r, p) for r, p in free.items()), default=-1.0)
        return self.members["head"].accepted[-1] > best

    def to_json(self) -> dict:
        return {"format": "draftsmith-hybrid-1", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict, source: str = "hybrid policy") -> HybridPolicy:
        if data.get("format") != "draftsmith-hybrid-1":
            raise ValueError(f"{source}: not a draftsmith hybrid policy (format {data.get('format')!r})")
        members = {r: Calibration(**c) for r, c in data["members"].items()}
        bad = [r for r in members if r not in ROLES]
        if bad or "head" not in members or len(members) < 2:
            raise ValueError(f"{source}: members {list(members)}: want the head and ngram and/or suffix")
        for r, c in members.items():
            if not (len(c.accepted) == len(c.counts) == len(c.edges) + 1):
                raise ValueError(f"{source}: member {r}: {len(c.edges)} edges for {len(c.accepted)} bins")
        depth = data.get("head_depth")
        if depth is not None and not 1 <= int(depth) <= int(data["k"]):
            raise ValueError(f"{source}: head_depth {depth} outside 1..k={data['k']}")
        temperature = float(data.get("temperature", 0.0))
        if not temperature >= 0.0:
            raise ValueError(f"{source}: temperature {temperature}: want >= 0")
        return cls(
            k=int(data["k"]),
            members=members,
            fitted_on=data.get("fitted_on", {}),
            head_depth=None if depth is None else int(depth),
            temperature=temperature,
        )

    def save(self, head_dir: str | Path) -> Path:
        """Write head_dir/hybrid.json holding this policy alone (see HybridPolicies.save for several)."""
        return HybridPolicies([self]).save(head_dir)

    def check_disjoint(self, prompts: list[list[int]], what: str) -> None:
        """Refuse to evaluate on prompts the policy was fitted on."""
        seen = set(self.fitted_on.get("prompt_keys", []))
        hits = [i for i, p in enumerate(prompts) if prompt_key(p) in seen]
        if hits:
            raise ValueError(
                f"{what}: prompts {hits[:5]}{'...' if len(hits) > 5 else ''} ({len(hits)} of {len(prompts)}) are among "
                "the conversations the hybrid policy was fitted on; evaluate on held-out prompts"
            )


@dataclass
class HybridPolicies:
    """The policies fitted next to one head (hybrid.json), one per sampling temperature. A request is drafted by
    the policy fitted nearest its temperature (greedy requests: 0): at T=1 the target's answers repeat their
    context less, so suffix and ngram are accepted less per signal than on greedy answers."""

    policies: list[HybridPolicy]

    def __post_init__(self):
        if not self.policies:
            raise ValueError("a hybrid policy file needs at least one policy")
        self.policies = sorted(self.policies, key=lambda p: p.temperature)
        temps = [p.temperature for p in self.policies]
        if len(set(temps)) != len(temps):
            raise ValueError(f"hybrid policies: temperatures {temps} repeat")
        if len({p.k for p in self.policies}) > 1:
            raise ValueError(f"hybrid policies: k {[p.k for p in self.policies]} differ; one k per head directory")

    @property
    def k(self) -> int:
        return self.policies[0].k

    @property
    def depth(self) -> int:
        """The head chain's passes when it runs: the deepest policy's (a batch shares one chain length)."""
        return max(p.depth for p in self.policies)

    @property
    def members(self) -> list[str]:
        """Every role some policy names, in ROLES order."""
        return [r for r in ROLES if any(r in p.members for p in self.policies)]

    @property
    def temperatures(self) -> list[float]:
        return [p.temperature for p in self.policies]

    def for_temperature(self, temperature: float) -> HybridPolicy:
        """The policy fitted nearest this temperature (greedy = 0; on a tie the lower one)."""
        t = max(0.0, float(temperature))
        return min(self.policies, key=lambda p: (abs(p.temperature - t), p.temperature))

    def check_disjoint(self, prompts: list[list[int]], what: str) -> None:
        for p in self.policies:
            p.check_disjoint(prompts, what)

    def to_json(self) -> dict:
        return {"format": "draftsmith-hybrid-2", "policies": [p.to_json() for p in self.policies]}

    @classmethod
    def from_json(cls, data: dict, source: str = "hybrid policy") -> HybridPolicies:
        if data.get("format") == "draftsmith-hybrid-1":  # one greedy policy (files fitted before temperatures)
            return cls([HybridPolicy.from_json(data, source)])
        if data.get("format") != "draftsmith-hybrid-2" or not isinstance(data.get("policies"), list):
            raise ValueError(f"{source}: not a draftsmith hybrid policy (format {data.get('format')!r})")
        return cls([HybridPolicy.from_json(p, f"{source}, policy {i}") for i, p in enumerate(data["policies"])])

    def save(self, head_dir: str | Path) -> Path:
        path = Path(head_dir) / POLICY_FILE
        atomic_write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, head_dir: str | Path) -> HybridPolicies:
        path = Path(head_dir) / POLICY_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path}: no hybrid policy next to this head; fit one with `draftsmith eval fit-hybrid --head "
                f"{head_dir} --data TRAINING.jsonl`"
            ) from None
        except ValueError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_json(data, str(path))
