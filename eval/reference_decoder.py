"""In-process reference speculative decoder over the HF target: chain drafting, one-forward verification,
the standard rejection-sampling rule, and the acceptance statistics vLLM reports.

    from draftsmith.eval.reference_decoder import decode_prompts, load_drafter
    stats = decode_prompts(target, load_drafter("ngram"), prompt_ids, k=3, max_tokens=128)

One round, with committed tokens x_0..x_m (x_m sampled, not yet fed to the target):

    drafter.propose(x_0..x_m, k)        -> d_1..d_j (j <= k) and the draft distributions q_i they came from
    target.step([x_m, d_1..d_j])        -> target distributions p_0..p_j  (one forward, KV cache)
    verify: d_i accepted with prob min(1, p_i(d_i) / q_i(d_i)); on the first rejection the next token is
            drawn from normalise(max(0, p_i - q_i)); when all j are accepted a bonus token from p_j
    cache cropped to the accepted prefix; drafter.observe(rows m..m+n, their next tokens, target features)

A deterministic drafter (ngram, suffix, EAGLE-3 with greedy drafts as vLLM runs it) has q_i = one-hot,
so acceptance is p_i(d_i) and the residual is p_i with d_i removed. At temperature 0 the rule becomes
"accept while d_i equals the target's argmax", and the output equals plain greedy decoding token for token.

Drafters share one small interface (`Drafter`): `start(prompt)`, `observe(start, next_tokens, feats)`
(the target's features for newly committed positions), `propose(tokens, k, temperature, generator)`,
`finish(output)`. EAGLE-3 and DFlash consume aux states; an MLP speculator consumes the final hidden state.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.eval.baselines import SuffixIndex
from draftsmith.serve.ngram import ngram_match
from draftsmith.serve.policy import Proposal, chain_score
from draftsmith.train.target import Features, Target


class Drafter:
    """A chain drafter. Subclasses override `propose`; feature-driven ones also `start`/`observe`."""

    name = "drafter"

    def start(self, prompt: list[int]) -> None:
        pass

    def observe(self, start: int, next_tokens: list[int], feats: Features) -> None:
        """Target features for positions start..start+n-1 (feats rows [n, ...]), with the token after each."""

    def propose(self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def finish(self, output: list[int]) -> None:
        pass

    def greedy_every_row(self, next_tokens: list[int], feats: Features, k: int) -> list[Proposal] | None:
        """What `propose` (greedy) returns after each committed row p of one sequence, all rows at once: rows
        0..n-1 with their features (feats rows [n, ...]) and the token after each; entry p is the proposal with
        rows 0..p observed. None where this drafter has no batched form (callers then propose row by row)."""
        return None


class HeadDrafter(Drafter):
    """A drafter backed by a trained head, drafting greedily (q one-hot, as vLLM does) or by sampling."""

    def _set_head(self, head, draft_sampling: str, name: str | None) -> None:
        if draft_sampling not in ("greedy", "sample"):
            raise ValueError(f"draft_sampling must be greedy or sample, got {draft_sampling!r}")
        self.head = head.eval()
        self.draft_sampling = draft_sampling
        self.name = name or self.name


class NoDrafter(Drafter):
    """Plain autoregressive decoding (the `none` method)."""

    name = "none"

    def propose(self, tokens, k, temperature, generator):
        return Proposal([])


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 5):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, tokens, k, temperature, generator):
        draft, n = ngram_match(tokens, k, self.min_n, self.max_n)
        return Proposal(draft, signal=float(n))


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(self, **kw):
        self.index = SuffixIndex(**kw)
        self._prompt_len = 0

    def start(self, prompt):
        self._prompt_len = len(prompt)

    def propose(self, tokens, k, temperature, generator):
        draft, _, score = self.index.speculate(tokens, k)
        return Proposal(draft, signal=score)

    def finish(self, output):
        self.index.remember(output)  # later requests can draw on this answer, as vLLM's suffix cache does


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] logits -> sampling distribution in fp64 (temperature > 0)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


class Eagle3Drafter(HeadDrafter):
    """EAGLE-3 chain drafting with vLLM's semantics.

    Committed row p (a position whose target features exist) takes embed(x_{p+1}) and fc(aux_p) and
    attends causally to all committed rows; draft step s > 0 at position m+s takes the drafted token and
    the previous step's output hidden, attending to the committed rows plus its own earlier steps.
    `draft_sampling="greedy"` drafts argmax tokens (q one-hot: what vLLM's EAGLE proposer does);
    "sample" draws from softmax(draft logits / T) and hands those q to the verifier.

    A P-EAGLE head (`config.parallel_drafting`) drafts as vLLM's parallel drafter does: steps 1..k-1 are mask slots
    at positions m+1..m+k-1, all in one forward on the fork (causal among themselves), read by no drafted token.
    """

    name = "eagle3"

    def __init__(self, head, draft_sampling: str = "greedy", name: str | None = None):
        self._set_head(head, draft_sampling, name)
        self.d2t = head.draft_to_target  # [Vd] draft id -> target id
        self.vocab_size = head.config.vocab_size
        self.start([])

    def start(self, prompt):
        self.cache = self.head.kv_cache()  # the draft layers' keys/values of the committed rows
        self.last_hidden: torch.Tensor | None = None  # [1, 1, H] output of the last committed row
        self.last_pos = -1

    @torch.no_grad()
    def observe(self, start, next_tokens, feats):
        n = len(next_tokens)
        assert start == self.last_pos + 1, f"rows must arrive in order: expected {self.last_pos + 1}, got {start}"
        tok = torch.tensor([next_tokens])  # [1, n]
        pos = torch.arange(start, start + n)[None]  # [1, n]
        hidden = self.head.fuse(feats.aux[-n:].to(self.head.fc.weight.dtype)[None])  # [1, n, H]
        out = self.head(tok, pos, hidden, self.cache)  # [1, n, H]; the rows join the cache
        self.last_hidden = out[:, -1:]  # [1, 1, H]
        self.last_pos = start + n - 1

    def _draw(self, hidden, temperature, generator) -> tuple[int, torch.Tensor | None, float]:
        """(target token id, its draft distribution or None for one-hot, its probability under the head)."""
        logits = self.head.logits(hidden)[0, -1]  # [Vd]
        own = torch.softmax(logits.float(), dim=-1)  # the head's own distribution, for the confidence signal
        if temperature == 0 or self.draft_sampling == "greedy":
            i = int(logits.argmax())
            return int(self.d2t[i]), None, float(own[i])
        q_d = target_probs(logits, temperature)  # [Vd]
        q = torch.zeros(self.vocab_size, dtype=q_d.dtype).index_add_(0, self.d2t, q_d)  # [V] over target ids
        i = _sample(q_d, generator)
        return int(self.d2t[i]), q, float(own[i])

    @torch.no_grad()
    def propose(self, tokens, k, temperature, generator):
        assert self.last_pos == len(tokens) - 2, "observe() the newest rows before proposing"
        out, probs, own = [], [], []
        hidden = self.last_hidden
        drafts = self.cache.fork()  # the draft steps' keys go here, never into the committed cache
        parallel = self.head.config.parallel_drafting
        if parallel and k > 1:  # the k-1 mask slots after the newest row, in one forward
            ids, mask = self.head.mask_inputs(1, k - 1)
            pos = torch.arange(self.last_pos + 1, self.last_pos + k)[None]  # [1, k-1]
            slots = self.head(ids, pos, mask.to(hidden.dtype), drafts)  # [1, k-1, H]
        for s in range(k):
            if s > 0 and parallel:
                hidden = slots[:, s - 1 : s]  # [1, 1, H]
            elif s > 0:  # draft step s at position last_pos + s: previous draft token + previous hidden
                pos = torch.tensor([[self.last_pos + s]])
                hidden = self.head(torch.tensor([[out[-1]]]), pos, self.head.carry(hidden), drafts)  # [1, 1, H]
            tok, q, p = self._draw(hidden, temperature, generator)
            out.append(tok)
            probs.append(q)
            own.append(p)
        return Proposal(
            out, None if not probs or probs[0] is None else torch.stack(probs), chain_score(own), confidences=own
        )

    @torch.no_grad()
    def greedy_every_row(self, next_tokens, feats, k):
        """Every row's greedy chain in k head calls instead of one chain per row: step 0 is the committed rows'
        causal pass, and step s reads each row's own step s-1 token (or a mask slot) attending to the committed
        rows up to it plus its own earlier steps: the TTT unroll's attention (`ttt_attention`), which is the
        context `propose` gives a chain drafted after that row."""
        n = len(next_tokens)
        if n == 0:
            return []
        pos = torch.arange(n)[None]  # [1, n]
        cache = self.head.ttt_cache()
        hidden = self.head.fuse(feats.aux[-n:].to(self.head.fc.weight.dtype)[None])  # [1, n, H]
        hidden = self.head(torch.tensor([next_tokens]), pos, hidden, cache)  # [1, n, H] the committed rows
        parallel = self.head.config.parallel_drafting
        tokens, probs = [], []
        for s in range(k):
            if s > 0 and parallel:
                ids, mask = self.head.mask_inputs(1, n)
                hidden = self.head(ids, pos + s, mask.to(hidden.dtype), cache)  # [1, n, H]
            elif s > 0:
                hidden = self.head(tokens[-1][None], pos + s, self.head.carry(hidden), cache)  # [1, n, H]
            logits = self.head.logits(hidden)[0]  # [n, Vd]
            i = logits.argmax(-1)  # [n]
            own = torch.softmax(logits.float(), dim=-1).gather(-1, i[:, None])[:, 0]  # [n]
            tokens.append(self.d2t[i])  # [n] target ids
            probs.append(own)
        toks, ps = torch.stack(tokens, -1).tolist(), torch.stack(probs, -1).tolist()  # [n, k]
        return [Proposal(t, None, chain_score(p), confidences=p) for t, p in zip(toks, ps)]


class DFlashDrafter(HeadDrafter):
    """DFlash block drafting with vLLM's semantics (`train/heads/dflash.py`): the committed rows' fused target states
    are every draft layer's context keys/values; a round drafts the newest token and k mask slots at positions
    p..p+k in one non-causal forward over the whole context, and slot j's argmax is draft j. With
    `draft_sampling="sample"` each slot's token is drawn from its own softmax(logits / T), the q handed to the
    verifier."""

    name = "dflash"

    def __init__(self, head, draft_sampling: str = "greedy", name: str | None = None):
        self._set_head(head, draft_sampling, name)
        self.d2t = head.draft_to_target
        self.vocab_size = head.config.vocab_size
        self.start([])

    def start(self, prompt):
        self.context: list | None = None  # per layer (k, v) [1, nkv, P, hd] of the committed rows
        self.last_pos = -1

    @torch.no_grad()
    def observe(self, start, next_tokens, feats):
        n = len(next_tokens)
        assert start == self.last_pos + 1, f"rows must arrive in order: expected {self.last_pos + 1}, got {start}"
        new = self.head.context(feats.aux[-n:][None], torch.arange(start, start + n)[None])
        self.context = new if self.context is None else [
            (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2)) for (k0, v0), (k1, v1) in zip(self.context, new)
        ]  # fmt: skip
        self.last_pos = start + n - 1

    @torch.no_grad()
    def propose(self, tokens, k, temperature, generator):
        assert self.last_pos == len(tokens) - 2, "observe() the newest rows before proposing"
        k = min(k, self.head.config.block_size - 1)
        p = len(tokens) - 1
        ids = self.head.block_inputs(torch.tensor([[tokens[-1]]]), k)  # [1, k+1]
        hidden = self.head(ids, torch.arange(p, p + k + 1)[None], self.context, None)  # [1, k+1, H]
        logits = self.head.logits(hidden[0, 1:])  # [k, Vd]
        own_all = torch.softmax(logits.float(), dim=-1)
        out, probs, own = [], [], []
        for j in range(k):
            if temperature == 0 or self.draft_sampling == "greedy":
                i, q = int(logits[j].argmax()), None
            else:
                q_d = target_probs(logits[j], temperature)
                i = _sample(q_d, generator)
                q = torch.zeros(self.vocab_size, dtype=q_d.dtype).index_add_(0, self.d2t, q_d)
            out.append(int(self.d2t[i]))
            probs.append(q)
            own.append(float(own_all[j, i]))
        return Proposal(
            out, None if not probs or probs[0] is None else torch.stack(probs), chain_score(own), confidences=own
        )


class MLPSpeculatorDrafter(HeadDrafter):
    """IBM MLP speculator: stage 0 reads the target's final hidden state at the row that produced the
    newest token, plus that token; stage i reads stage i-1's state and pick. Chains at most n_predict."""

    name = "mlp_speculator"

    def __init__(self, head, draft_sampling: str = "greedy", name: str | None = None):
        self._set_head(head, draft_sampling, name)
        self.last: torch.Tensor | None = None  # [E] final hidden state of the newest committed row
        self.last_pos = -1

    def start(self, prompt):
        self.last, self.last_pos = None, -1

    def observe(self, start, next_tokens, feats):
        self.last = feats.last[len(next_tokens) - 1]
        self.last_pos = start + len(next_tokens) - 1

    @torch.no_grad()
    def propose(self, tokens, k, temperature, generator):
        assert self.last_pos == len(tokens) - 2, "observe() the newest rows before proposing"
        state = self.head.prepare(self.last[None])  # [1, E]
        token = torch.tensor([tokens[-1]])
        out, probs, own = [], [], []
        for i in range(min(k, self.head.config.n_predict)):
            state = self.head.step(i, state, token)  # [1, D]
            logits = self.head.logits(i, state)[0]  # [Vd] (the target's vocab without a draft vocab)
            if temperature == 0 or self.draft_sampling == "greedy":
                row, q = int(logits.argmax()), None
            else:
                q_d = target_probs(logits, temperature)  # [Vd]
                row = _sample(q_d, generator)
                d2t, q = self.head.draft_to_target, q_d
                if d2t is not None:  # the draft vocab's distribution over target ids
                    q = torch.zeros(self.head.config.vocab_size, dtype=q_d.dtype).index_add_(0, d2t, q_d)
            tok = int(self.head.to_target(torch.tensor(row)))  # the pick as a target id
            out.append(tok)
            probs.append(q)
            own.append(float(torch.softmax(logits.float(), dim=-1)[row]))
            token = torch.tensor([tok])
        return Proposal(
            out, None if not probs or probs[0] is None else torch.stack(probs), chain_score(own), confidences=own
        )


class OracleDrafter(Drafter):
    """Per step, the member whose draft greedy verification would accept furthest: what a perfect per-step
    choice between these drafters reaches (the target of a hybrid of the head and suffix/ngram).

    It knows the future: `references` maps each prompt's ids to its greedy output (plain decoding's, or any
    greedy speculative run's, which is the same), and a draft is accepted exactly as far as it matches that
    output (one running past the end of that output counts up to its end). So it measures; it is not a method
    to serve. Temperature 0 only. Ties go to the shorter draft (an empty one when nothing would be accepted).
    Every member observes every step, as it would alone.
    `sources` counts per member the steps it was chosen, the tokens it drafted there and those accepted.
    """

    def __init__(self, members: dict[str, Drafter], references: dict[tuple[int, ...], list[int]], name: str):
        if len(members) < 2:
            raise ValueError(f"an oracle chooses among two drafters or more, got {list(members)}")
        self.members, self.references, self.name = members, references, name
        self.sources = {m: {"steps": 0, "draft_tokens": 0, "accepted_tokens": 0} for m in members}
        self._ahead: list[int] = []
        self._prompt_len = 0

    def start(self, prompt):
        ref = self.references.get(tuple(prompt))
        if ref is None:
            raise ValueError(f"the oracle has no greedy output for the prompt starting {list(prompt[:8])}")
        self._ahead, self._prompt_len = ref, len(prompt)
        for d in self.members.values():
            d.start(prompt)

    def observe(self, start, next_tokens, feats):
        for d in self.members.values():
            d.observe(start, next_tokens, feats)

    def propose(self, tokens, k, temperature, generator):
        if temperature != 0:
            raise ValueError("the oracle is defined for greedy decoding (temperature 0) only")
        ahead = self._ahead[len(tokens) - self._prompt_len :]  # what greedy decoding commits next
        best = None
        for name, d in self.members.items():
            draft = d.propose(tokens, k, temperature, generator).tokens[:k]
            n = next((i for i, (a, b) in enumerate(zip(draft, ahead)) if a != b), min(len(draft), len(ahead)))
            if best is None or (n, -len(draft)) > best[0]:
                best = ((n, -len(draft)), name, draft)
        (n, _), name, draft = best
        src = self.sources[name]
        src["steps"] += 1
        src["draft_tokens"] += len(draft)
        src["accepted_tokens"] += n
        return Proposal(draft)

    def finish(self, output):
        for d in self.members.values():
            d.finish(output)


# ---------------------------------------------------------------- verification


def verify_greedy(draft: list[int], logits: torch.Tensor) -> tuple[int, int]:
    """(accepted count, next token) at temperature 0: accept while the draft equals the target argmax.
    logits: [len(draft)+1, V], row i predicts the token after input i."""
    top = logits.argmax(-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == top[n]:
        n += 1
    return n, top[n]


def verify_sampled(
    draft: list[int], q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Rejection sampling: (accepted count, next token) with the output distributed exactly as p.

    Args:
        q: [len(draft), V] draft distributions (None: each draft was deterministic, q one-hot).
        p: [len(draft)+1, V] target distributions; row len(draft) gives the bonus token.
    """
    for i, d in enumerate(draft):
        qi = F.one_hot(torch.tensor(d), p.shape[-1]).to(p.dtype) if q is None else q[i].to(p.dtype)
        ratio = p[i, d] / qi[d] if qi[d] > 0 else torch.tensor(0.0, dtype=p.dtype)
        u = torch.rand((), generator=generator, dtype=p.dtype)
        if u < ratio:  # accepted with probability min(1, p/q)
            continue
        residual = (p[i] - qi).clamp_min(0)  # [V]
        total = residual.sum()
        # p == q exactly would never reject; float dust can leave ~0 mass: then p itself is the residual
        return i, _sample(residual / total if total > 1e-12 else p[i], generator)
    return len(draft), _sample(p[len(draft)], generator)


# ---------------------------------------------------------------- decoding


@dataclass
class DecodeStats:
    """Counters in vLLM's convention, plus timings and acceptance by output position."""

    k: int
    num_drafts: int = 0  # rounds that proposed >= 1 token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    generated_tokens: int = 0
    target_steps: int = 0  # target forwards, prefill included
    target_s: float = 0.0
    draft_s: float = 0.0  # propose + observe (a drafter's full cost)
    wall_s: float = 0.0
    bin_size: int = 16
    pos_drafted: list[int] = field(default_factory=list)  # per output-position bin: draft tokens proposed there
    pos_accepted: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.k

    def record_round(self, out_len: int, drafted: int, accepted: int) -> None:
        if drafted:
            self.num_drafts += 1
            self.num_draft_tokens += drafted
            self.num_accepted_tokens += accepted
            for i in range(accepted):
                self.accepted_per_pos[i] += 1
        for i in range(drafted):
            b = (out_len + i) // self.bin_size
            while len(self.pos_drafted) <= b:
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            self.pos_drafted[b] += 1
            self.pos_accepted[b] += int(i < accepted)

    def summary(self) -> dict:
        d = self.num_drafts
        t_step = self.target_s / self.target_steps if self.target_steps else None
        t_draft = self.draft_s / self.num_draft_tokens if self.num_draft_tokens else None
        return {
            "counters": {
                "num_drafts": d,
                "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            },
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            "mean_acceptance_length": 1.0 + self.num_accepted_tokens / d if d else (1.0 if self.k else None),
            "per_position_acceptance": [a / d for a in self.accepted_per_pos] if d else None,
            "tokens_per_target_step": self.generated_tokens / self.target_steps if self.target_steps else None,
            "generated_tokens": self.generated_tokens,
            "target_steps": self.target_steps,
            "target_step_s": t_step,
            "draft_token_s": t_draft,
            # c: one draft token's cost in target steps, the `c` of the speedup formula
            "draft_cost_ratio": t_draft / t_step if t_draft is not None and t_step else None,
            "wall_s": self.wall_s,
            "output_tokens_per_s": self.generated_tokens / self.wall_s if self.wall_s else None,
            "acceptance_by_output_position": {
                "bin_size": self.bin_size,
                "draft_tokens": list(self.pos_drafted),
                "acceptance_rate": [a / n if n else None for a, n in zip(self.pos_accepted, self.pos_drafted)],
            },
        }


@torch.no_grad()
def speculative_generate(
    target: Target,
    drafter: Drafter,
    prompt: list[int],
    k: int,
    max_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    stop_ids: tuple[int, ...] = (),
    stats: DecodeStats | None = None,
) -> list[int]:
    """Generate up to max_tokens after `prompt` with speculative decoding; returns the new token ids."""
    stats = stats or DecodeStats(k=k)
    t_start = time.perf_counter()
    greedy = temperature == 0

    def pick(logits_row: torch.Tensor) -> int:
        return int(logits_row.argmax()) if greedy else _sample(target_probs(logits_row, temperature), generator)

    cache = target.new_cache()
    t0 = time.perf_counter()
    f = target.step(torch.tensor([prompt]), cache)  # prefill
    stats.target_s += time.perf_counter() - t0
    stats.target_steps += 1
    x = pick(f.logits[0, -1])
    tokens, out = list(prompt) + [x], [x]
    t0 = time.perf_counter()
    drafter.start(list(prompt))
    drafter.observe(0, tokens[1:], _rows(f, len(prompt)))
    stats.draft_s += time.perf_counter() - t0
    while len(out) < max_tokens and x not in stop_ids:
        m = len(tokens) - 1  # position of the newest token, not yet in the target's cache
        t0 = time.perf_counter()
        prop = drafter.propose(tokens, k, temperature, generator)
        stats.draft_s += time.perf_counter() - t0
        draft = prop.tokens[:k]
        t0 = time.perf_counter()
        f = target.step(torch.tensor([[tokens[-1], *draft]]), cache)  # rows m..m+len(draft)
        stats.target_s += time.perf_counter() - t0
        stats.target_steps += 1
        logits = f.logits[0]  # [len(draft)+1, V]
        if greedy:
            n, y = verify_greedy(draft, logits)
        else:
            n, y = verify_sampled(draft, prop.probs, target_probs(logits, temperature), generator)
        stats.record_round(len(out), len(draft), n)
        Target.truncate_cache(cache, m + n + 1)  # keep x_m and the accepted drafts
        new = draft[:n] + [y]
        t0 = time.perf_counter()
        drafter.observe(m, new, _rows(f, n + 1))
        stats.draft_s += time.perf_counter() - t0
        tokens += new
        out += new
        if any(t in stop_ids for t in new):
            break
    for i, t in enumerate(out):  # stop at the first stop token, as a server does
        if t in stop_ids:
            out = out[: i + 1]
            break
    out = out[:max_tokens]
    drafter.finish(out)
    stats.generated_tokens += len(out)
    stats.wall_s += time.perf_counter() - t_start
    return out


def _rows(f: Features, n: int) -> Features:
    """The first n rows of a batch-1 forward's features, as [n, ...] tensors."""
    return Features(aux=f.aux[0, :n], last=f.last[0, :n], logits=f.logits[0, :n])


def generation_stop_ids(tokenizer, target: str | Path) -> tuple[int, ...]:
    """The ids a greedy decode stops on, as vLLM does: the tokenizer's eos and generation_config.json's."""
    f = Path(target) / "generation_config.json"
    eos = json.loads(f.read_text()).get("eos_token_id") if f.is_file() else None
    extra = [eos] if isinstance(eos, int) else list(eos or [])
    return tuple(sorted({i for i in [tokenizer.eos_token_id, *extra] if i is not None}))


def decode_prompts(
    target: Target,
    drafter: Drafter,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_ids: tuple[int, ...] = (),
    progress=None,
) -> tuple[list[list[int]], dict]:
    """Speculative decoding of every prompt with one drafter: (outputs, summary statistics)."""
    gen = torch.Generator().manual_seed(seed)
    stats = DecodeStats(k=k)
    outputs = []
    for i, p in enumerate(prompts):
        outputs.append(speculative_generate(target, drafter, p, k, max_tokens, temperature, gen, stop_ids, stats))
        if progress:
            progress(i + 1, len(prompts), stats.generated_tokens)
    return outputs, stats.summary()


# ---------------------------------------------------------------- loading drafters


def load_head_drafter(
    name: str, path: str | Path, target: Target, draft_sampling: str = "greedy"
) -> tuple[Drafter, dict]:
    """A trained head (checkpoint / run dir or exported dir, any family) as its family's drafter, checked against
    the target first; returns it with the head's training metrics ({} for exports)."""
    from draftsmith.train.checkpoint import check_head_fits_target, head_from_state, read_head

    family, config, state, metrics = read_head(path)
    check_head_fits_target(config, target.config, path, family.name)
    head = head_from_state(family, config, state, path)
    head.attach_target(target)
    head = head.to(next(target.model.parameters()).dtype)
    return family.drafter(head, draft_sampling=draft_sampling, name=name), metrics


def load_drafter(
    name: str,
    head_path: str | None = None,
    target: Target | None = None,
    ngram_min: int = 2,
    ngram_max: int = 5,
    draft_sampling: str = "greedy",
) -> Drafter:
    """A drafter by method name (`none`, `ngram`, `suffix`) or a trained head directory."""
    if head_path is None:
        if name == "none":
            return NoDrafter()
        if name == "ngram":
            return NgramDrafter(ngram_min, ngram_max)
        if name == "suffix":
            return SuffixDrafter()
        raise ValueError(f"unknown method {name!r} (none, ngram, suffix, or a head directory)")
    return load_head_drafter(name, head_path, target, draft_sampling)[0]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens per verification round when each draft token is accepted i.i.d. with prob α: (1−α^(k+1))/(1−α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al.'s expected wall-clock speedup (1−α^(k+1)) / ((1−α)(k·c+1)); c = draft cost / target step."""
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def alpha_from_tau(tau: float, k: int) -> float:
    """The i.i.d. acceptance rate α whose expected tokens per round equals a measured τ (bisection)."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"τ={tau} outside [1, k+1={k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def recommend_k(alpha_by_k: dict[int, float], c: float) -> tuple[int, dict[int, float]]:
    """The k with the highest expected speedup, and every k's expected speedup."""
    speed = {k: expected_speedup(a, k, c) for k, a in alpha_by_k.items() if a is not None and not math.isnan(a)}
    if not speed:
        raise ValueError("no acceptance figures to recommend k from")
    return max(speed, key=lambda k: (speed[k], -k)), speed
