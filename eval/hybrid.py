"""The hybrid drafter: per step, the trained head's draft or a training-free one (suffix, ngram), whichever a
policy fitted on conversations of the training distribution expects verification to accept furthest.

    # on the conversations right after those the head trained on (the preset: ShareGPT's 2,001st on)
    draftsmith eval fit-hybrid --target smollm2 --head exported/eagle3_smollm2
    draftsmith eval fit-hybrid ... --data sharegpt --skip 2000      # the same, said explicitly
    draftsmith eval fit-hybrid ... --temperature 1     # a second policy, for sampled requests
    # -> exported/eagle3_smollm2/hybrid.json; `draftsmith eval matrix --head mine=exported/eagle3_smollm2 ...`
    #    then adds the row hybrid(mine) beside the head, ngram, suffix and the oracle

Every member drafts every step; each states how sure it is before verification (`Proposal.signal`): the head
and suffix their own expected accepted tokens (the sum of the running products of the drafted tokens'
probabilities, arctic-inference's suffix score), ngram the length of the n-gram it matched. The policy maps
each member's signal to the tokens that member really had accepted at that signal on the fit's
conversations (binned, made non-decreasing), and proposes the member with the most. The choice uses nothing
past the committed tokens, so the verification rule is untouched: greedy output equals plain decoding, and at
temperature > 0 the output distribution is the target's (the chosen member's draft distribution goes to the
verifier with its tokens).

The fit's conversations should be ones the head did not train on: on its own training answers the head is
accepted far more often than on new prompts (the preset head: 2.48 tokens per target step against 1.79 on the
next ShareGPT conversations), so a policy fitted there overrates it and its own figures overstate what serving
will give (served, such a policy gave suffix half the steps and came out within 1.2 % of the unseen fit).

Fitting needs no speculative decoding. For each conversation the target answers its first turn
(greedily, or sampled at the policy's temperature; vLLM when installed, cached); one forward over prompt + answer
gives the target's features at every position, and at each position every member proposes exactly as it would
inside a decode (same committed tokens, same features, same suffix history), and its draft counts as accepted as
far as it matches the answer (at T > 0 that is the law of vLLM's rejection of a greedy draft; see fit_hybrid).
From these per-position records the policy's tokens per target step on the fit's conversations is simulated
exactly (a step at position j advances by the accepted count + 1), beside each member alone and the oracle (the
best member at every step). hybrid.json keeps one policy per temperature fitted (HybridPolicies); each request
uses the one fitted nearest its temperature.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
from pathlib import Path

import torch

from draftsmith.argtypes import positive_int
from draftsmith.atomic import atomic_write_json
from draftsmith.errors import ConfigError
from draftsmith.eval.reference_decoder import Drafter, NgramDrafter, SuffixDrafter
from draftsmith.serve.policy import POLICY_FILE, ROLES, Calibration, HybridPolicies, HybridPolicy, Proposal, prompt_key
from draftsmith.train.checkpoint import head_digest as _head_digest
from draftsmith.train.target import Features, Target


def _monotone(means: list[float], weights: list[int]) -> list[float]:
    """Pool adjacent violators: the non-decreasing sequence closest to `means` in weighted least squares."""
    blocks: list[list[float]] = []  # [mean, weight, size]
    for m, w in zip(means, weights):
        blocks.append([m, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2) if w1 + w2 else m1, w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


def calibrate(signals: list[float], accepted: list[int], bins: int = 8) -> Calibration:
    """Quantile bins of the signal (distinct edges), the mean accepted per bin, made non-decreasing."""
    if not signals:
        return Calibration(edges=[], accepted=[0.0], counts=[0])
    order = sorted(signals)
    edges = sorted({order[max(0, (i * len(order)) // bins - 1)] for i in range(1, bins)})  # group tops
    edges = [e for e in edges if e < order[-1]]  # the last bin is open above
    sums, counts = [0.0] * (len(edges) + 1), [0] * (len(edges) + 1)
    for s, a in zip(signals, accepted):
        i = bisect.bisect_left(edges, s)
        sums[i] += a
        counts[i] += 1
    keep = [i for i, c in enumerate(counts) if c]  # merge empty bins into the next
    edges = [edges[i] for i in keep[:-1]]
    means = [sums[i] / counts[i] for i in keep]
    counts = [counts[i] for i in keep]
    return Calibration(edges=edges, accepted=[round(m, 4) for m in _monotone(means, counts)], counts=counts)


# ---------------------------------------------------------------- the drafter


class HybridDrafter(Drafter):
    """Every member drafts every step (each observes every step, as it would alone); the policy picks one.
    `sources` counts per member the steps it was chosen, the tokens it drafted there and those accepted."""

    def __init__(self, members: dict[str, Drafter], policy: HybridPolicy | HybridPolicies, name: str):
        policies = policy if isinstance(policy, HybridPolicies) else HybridPolicies([policy])
        missing = [r for r in policies.members if r not in members]
        if missing:
            raise ValueError(f"{name}: the policy needs members {missing}")
        self.members = {r: d for r, d in members.items() if r in policies.members}
        self.policies, self.name = policies, name
        self.sources = {self._label(r): {"steps": 0, "draft_tokens": 0, "accepted_tokens": 0} for r in self.members}
        self._pending: tuple[str, int] | None = None  # (label, draft length) of the proposal being verified

    def _label(self, role: str) -> str:
        return getattr(self.members[role], "name", role) if role == "head" else role

    def start(self, prompt):
        self._pending = None
        for d in self.members.values():
            d.start(prompt)

    def observe(self, start, next_tokens, feats):
        if self._pending is not None:  # the tokens after a verification: the accepted drafts + one
            label, drafted = self._pending
            self.sources[label]["accepted_tokens"] += min(len(next_tokens) - 1, drafted)
            self._pending = None
        for d in self.members.values():
            d.observe(start, next_tokens, feats)

    def propose(self, tokens, k, temperature, generator):
        policy = self.policies.for_temperature(temperature)
        depth = min(k, policy.depth)  # the head's chain stops there; suffix and ngram draft up to k
        proposals = {
            r: d.propose(tokens, depth if r == "head" else k, temperature, generator)
            for r, d in self.members.items()
            if r in policy.members
        }
        role = policy.choose(proposals)
        p = proposals[role]
        draft = p.tokens[:k]
        src = self.sources[self._label(role)]
        src["steps"] += 1
        src["draft_tokens"] += len(draft)
        self._pending = (self._label(role), len(draft))
        return Proposal(draft, None if p.probs is None else p.probs[: len(draft)], p.signal)

    def finish(self, output):
        for d in self.members.values():
            d.finish(output)


def hybrid_members(head: Drafter, roles, ngram_min: int = 2, ngram_max: int = 5) -> dict[str, Drafter]:
    """The members a policy names: the head drafter given, fresh ngram / suffix drafters."""
    fresh = {"ngram": lambda: NgramDrafter(ngram_min, ngram_max), "suffix": SuffixDrafter}
    return {r: head if r == "head" else fresh[r]() for r in roles}


# ---------------------------------------------------------------- fitting


def _slice(f: Features, a: int, b: int) -> Features:
    return Features(aux=f.aux[0, a:b], last=f.last[0, a:b], logits=f.logits[0, a:b])


def _matched(draft: list[int], ahead: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(draft, ahead)) if a != b), min(len(draft), len(ahead)))


@torch.no_grad()
def record_positions(
    target: Target,
    members: dict[str, Drafter],
    conversations: list[tuple[list[int], list[int]]],
    k: int,
    progress=None,
    batched: bool = True,
) -> list[list[dict]]:
    """Per conversation (prompt ids, answer ids), per answer position j (answer[:j+1] committed): each member's
    {"n": draft length, "signal", "accepted"}, as each would propose inside a decode that produced this answer
    (members draft greedily; "accepted": how far the draft matches the answer). A head drafts every position's
    chain in k batched calls (`greedy_every_row`; ~4 head calls a position at batch 1 were the fit's cost), the
    others propose position by position; batched=False proposes every member position by position."""
    out = []
    for c, (prompt, answer) in enumerate(conversations):
        seq = prompt + answer
        f = target.step(torch.tensor([seq]), target.new_cache())  # every position's features in one forward
        n_p = len(prompt)
        rows = len(seq) - 2  # committed rows 0..rows-1: the last proposal follows row n_p + len(answer) - 3
        every_row = {
            role: d.greedy_every_row(seq[1 : rows + 1], _slice(f, 0, rows), k) if batched else None
            for role, d in members.items()
        }
        stepped = {role: d for role, d in members.items() if every_row[role] is None}
        for d in stepped.values():
            d.start(list(prompt))
            d.observe(0, seq[1 : n_p + 1], _slice(f, 0, n_p))
        recs = []
        for j in range(len(answer) - 1):
            tokens, ahead = seq[: n_p + j + 1], answer[j + 1 :]
            rec = {}
            for role, d in members.items():
                p = d.propose(tokens, k, 0.0, None) if role in stepped else every_row[role][n_p + j - 1]
                draft = p.tokens[:k]
                rec[role] = {"n": len(draft), "signal": p.signal or 0.0, "accepted": _matched(draft, ahead)}
                if p.confidences is not None:  # lets fit_policy calibrate the head at any shorter depth
                    rec[role]["p"] = [round(float(x), 6) for x in p.confidences[:k]]
            recs.append(rec)
            for d in stepped.values():
                d.observe(n_p + j, [answer[j + 1]], _slice(f, n_p + j, n_p + j + 1))
        for d in members.values():
            d.finish(list(answer))
        out.append(recs)
        if progress:
            progress(c + 1, len(conversations))
    return out


def simulate(records: list[list[dict]], choose) -> dict:
    """Greedy decoding over the recorded conversations with `choose(rec) -> role or None` picking each step's
    draft: tokens per target step (the prefill excluded) and the steps each role was chosen."""
    tokens = steps = 0
    chosen: dict[str, int] = {}
    for recs in records:
        j = 0
        while j < len(recs):
            role = choose(recs[j])
            a = recs[j][role]["accepted"] if role else 0
            chosen[role or "none"] = chosen.get(role or "none", 0) + 1
            tokens, steps, j = tokens + a + 1, steps + 1, j + a + 1
    return {"tokens_per_step": tokens / steps if steps else None, "steps": steps, "chosen": chosen}


def at_depth(records: list[list[dict]], depth: int) -> list[list[dict]]:
    """The records as if the head's chain stopped after `depth` tokens: its first `depth` greedy tokens are the
    same whatever the chain's length, so its draft, accepted count and signal (the chain score of its first
    `depth` confidences) follow from the full chain's record."""
    from draftsmith.serve.policy import chain_score

    out = []
    for recs in records:
        cut = []
        for rec in recs:
            h = rec.get("head")
            if h is not None and h["n"] > depth:
                if "p" not in h:
                    raise ValueError("records without the head's per-token confidences cannot be cut to a depth")
                h = {**h, "n": depth, "accepted": min(h["accepted"], depth), "p": h["p"][:depth]}
                h["signal"] = chain_score(h["p"])
                rec = {**rec, "head": h}
            cut.append(rec)
        out.append(cut)
    return out


def fit_policy(
    records: list[list[dict]], k: int, bins: int = 16, head_depth: int | None = None
) -> tuple[HybridPolicy, dict]:
    """The policy from per-position records, and the simulated tokens per step on them: each member alone, the
    policy, the oracle. With `head_depth` < k the head is calibrated and simulated drafting that many tokens."""
    if head_depth is not None and head_depth < k:
        records = at_depth(records, head_depth)
    roles = list(records[0][0]) if records and records[0] else []
    members = {}
    for r in roles:
        pts = [(rec[r]["signal"], rec[r]["accepted"]) for recs in records for rec in recs if rec[r]["n"]]
        members[r] = calibrate([s for s, _ in pts], [a for _, a in pts], bins)
    policy = HybridPolicy(k=k, members=members, head_depth=head_depth if head_depth and head_depth < k else None)

    def as_proposals(rec):
        return {r: Proposal([0] * rec[r]["n"], signal=rec[r]["signal"]) for r in rec}

    figures = {r: simulate(records, lambda rec, r=r: r) for r in roles}
    figures["policy"] = simulate(records, lambda rec: policy.choose(as_proposals(rec)))
    figures["oracle"] = simulate(
        records, lambda rec: max(rec, key=lambda r: (rec[r]["accepted"], -rec[r]["n"])) if rec else None
    )
    return policy, figures


def fit_data(head_dir: str | Path, data: str | None, skip: int | None, log=print) -> tuple[str, int]:
    """(data, skip) to fit on: `data` from `skip` on; without `data`, the head's own training data after the
    conversations it trained on (`training_data`: regen:SOURCE trains on SOURCE's first turns), so the policy
    sees the head on conversations of its kind that it never saw. A fit on the head's own training conversations
    is allowed, with a warning: there the head is accepted far more often than on new prompts."""
    from draftsmith.train.checkpoint import training_data
    from draftsmith.train.data.conversations import resolve_path

    trained = training_data(head_dir) or {}
    source = trained.get("data")
    source = source.removeprefix("regen:") if source else None
    n = trained.get("conversations")
    if data is None:
        if not source:
            raise ConfigError(
                f"{head_dir} does not record what it was trained on: give --data (conversations of the kind it "
                "was trained on, but not the ones it saw)"
            )
        if n is None:
            raise ConfigError(
                f"{head_dir} was trained on all of {source}: give --data with conversations it did not see"
            )
        data, skip = source, n if skip is None else skip
        log(f"fit-hybrid: the head trained on the first {n} conversations of {source}: fitting on those after {skip}")
    skip = 0 if skip is None else skip
    local = source is not None and not source.startswith("hf:") and not data.startswith("hf:")
    same = data == source or (local and resolve_path(data).resolve() == resolve_path(source).resolve())
    if same and (n is None or skip < n):
        log(
            f"fit-hybrid: warning: the head trained on the first {n if n is not None else 'all'} conversations of "
            f"{source}; on its own training answers it is accepted far more often than on new prompts, so this "
            f"policy will overrate it (omit --data, or give --skip {n})"
        )
    return data, skip


def fit_conversations(
    target: str,
    head_dir: Path,
    data,
    num_conversations: int,
    max_tokens: int,
    skip: int | None = None,
    exclude=None,
    temperature: float = 0.0,
    seed: int = 0,
    backend: str = "auto",
    log=print,
) -> tuple[str, int, list[list[int]], list[tuple[list[int], list[int]]]]:
    """What a fit records: (data, skip, the rendered first turns, (prompt, answer) pairs with the target's answers,
    cached). `fit_data` picks the turns; prompts in `exclude` never reach the fit."""
    from transformers import AutoTokenizer

    from draftsmith.assets import cache_dir
    from draftsmith.eval.prompts import first_turns, load_prompts, render_prompts
    from draftsmith.generate import cached_generate

    data, skip = fit_data(head_dir, None if data is None else str(data), skip, log)
    tokenizer = AutoTokenizer.from_pretrained(target)
    banned = set()
    if exclude:  # e.g. a run's heldout_prompts.jsonl: those first turns never reach the fit
        banned = {prompt_key(p) for p in render_prompts(tokenizer, load_prompts(exclude))}
        log(f"fit-hybrid: {len(banned)} prompts of {exclude} excluded")
    from transformers import AutoConfig

    # a first turn the target cannot answer in full (its prompt + max_tokens past the target's positions) is passed
    # over, as regeneration passes over long prompts: vLLM would refuse it and stop the fit
    limit = getattr(AutoConfig.from_pretrained(target), "max_position_embeddings", None)
    prompts, too_long = [], 0
    turns = first_turns(str(data), None if banned else skip + num_conversations)  # read as far as the fit takes
    for rec in itertools.islice(turns, skip, None):
        (ids,) = render_prompts(tokenizer, [rec])  # one at a time: only as many as the fit takes are rendered
        if limit and len(ids) + max_tokens > limit:
            too_long += 1
        elif prompt_key(ids) not in banned:
            prompts.append(ids)
            if len(prompts) == num_conversations:
                break
    if too_long:
        log(f"fit-hybrid: {too_long} first turns passed over: prompt + {max_tokens} tokens exceed the target's {limit}")
    if not prompts:
        raise ValueError(f"{data}: no conversations to fit on (skip={skip})")
    how = "greedily" if temperature == 0 else f"at temperature {temperature:g} (seed {seed})"
    log(f"fit-hybrid: {len(prompts)} first turns of {data}; the target answers them {how} ({max_tokens} tokens)")
    answers = cached_generate(
        target, prompts, max_tokens, temperature, seed, cache_dir=cache_dir() / "generated", backend=backend
    )
    convs = [(p, a) for p, a in zip(prompts, answers) if len(a) >= 2]
    return data, skip, prompts, convs


def fit_hybrid(
    target: str,
    head_dir: str | Path,
    data: str | Path | None,
    num_conversations: int = 64,
    max_tokens: int = 256,
    k: int = 3,
    roles: tuple[str, ...] = ("head", "ngram", "suffix"),
    bins: int = 16,
    skip: int | None = None,
    backend: str = "auto",
    exclude: str | Path | None = None,
    head_depth: int | None = None,
    records_path: str | Path | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    log=print,
) -> tuple[HybridPolicy, Path]:
    """Fit the hybrid policy of the exported head at head_dir on `data`'s first turns (from `skip` on; `fit_data`:
    by default the head's training data after the conversations it trained on); write it into head_dir/hybrid.json
    beside the policies fitted there at other temperatures (for the same head and k).

    `temperature`: the target answers the first turns at this temperature (sampled with `seed`). A draft counts
    as accepted as far as it matches that answer, which at T > 0 is exactly vLLM's rejection rule for one-hot
    drafts (every member here drafts greedily): the drafted token x survives with probability p(x), and on a
    rejection the token that replaces it is drawn from p without x, so the verified sequence and the accepted
    counts have the law of a sampled answer compared position by position with the draft.

    `records_path`: the per-position records are saved there (atomically) and read back by a later fit with the
    same head weights, first turns, answers, k and members, so a refit (another head depth, other bins) runs no
    forward pass."""
    from draftsmith.assets import resolve_target
    from draftsmith.eval.head_check import check_head_for_target
    from draftsmith.eval.reference_decoder import load_head_drafter
    from draftsmith.train.checkpoint import read_head

    if "head" not in roles or len(roles) < 2 or any(r not in ROLES for r in roles):
        raise ValueError(f"members {list(roles)}: the head and at least one of ngram, suffix")
    if num_conversations < 1 or k < 1 or max_tokens < 2:
        raise ValueError("--num-conversations and --k must be >= 1, --max-tokens >= 2")
    if head_depth is not None and not 1 <= head_depth <= k:
        raise ValueError(f"--head-depth {head_depth}: between 1 and --k {k}")
    if not temperature >= 0.0:
        raise ValueError(f"--temperature {temperature}: want >= 0 (0 = greedy)")
    target = resolve_target(str(target))
    head_dir = Path(head_dir)
    check_head_for_target(head_dir, target)  # an exported head, a checkpoint or a run dir, made for this target
    data, skip, prompts, convs = fit_conversations(
        target, head_dir, data, num_conversations, max_tokens, skip, exclude, temperature, seed, backend, log
    )

    family, head_config, head_state, _ = read_head(head_dir)  # the weights the fit uses (a run dir: its latest)
    digest = _head_digest(family.name, head_config, head_state)
    identity = records_identity(digest, convs, k, roles, temperature)
    records = None
    if records_path and Path(records_path).is_file():
        try:
            saved = json.loads(Path(records_path).read_text())
        except ValueError:
            saved = {}
        if saved.get("identity") == identity:
            records = saved["records"]
            log(f"fit-hybrid: per-position records read back from {records_path} (no forward pass)")
        else:
            log(f"fit-hybrid: {records_path} holds records of another head, data or k: recording anew")
    if records is None:
        tgt = Target.from_pretrained(target, aux_layer_ids=head_config.get("aux_layer_ids") or [0])
        head = load_head_drafter("head", head_dir, tgt)[0]
        members = hybrid_members(head, roles)

        def progress(i, n):
            if i == n or i % max(1, n // 8) == 0:
                log(f"fit-hybrid: recorded {i}/{n} conversations")

        records = record_positions(tgt, members, convs, k, progress)
        if records_path:
            atomic_write_json(Path(records_path), {"identity": identity, "records": records}, indent=None)
            log(f"fit-hybrid: per-position records saved to {records_path}")
    policy, figures = fit_policy(records, k, bins, head_depth)
    policy.temperature = temperature
    by_depth = {str(d): fit_policy(records, k, bins, d)[1]["policy"]["tokens_per_step"] for d in range(1, k + 1)}
    policy.fitted_on = {
        "head": digest,
        "temperature": temperature,
        "seed": seed,
        "data": str(data),
        "skip": skip,
        "excluded": str(exclude) if exclude else None,
        "conversations": len(convs),
        "positions": sum(len(r) for r in records),
        "max_tokens": max_tokens,
        "tokens_per_step": {name: f["tokens_per_step"] for name, f in figures.items()},
        "policy_chosen": figures["policy"]["chosen"],
        "policy_tokens_per_step_by_head_depth": by_depth,
        "prompt_keys": sorted(prompt_key(p) for p in prompts),
    }
    saved = HybridPolicies([*_kept_policies(head_dir, digest, k, temperature, log), policy])
    path = saved.save(head_dir)
    tps = policy.fitted_on["tokens_per_step"]
    log(
        "fit-hybrid: tokens per target step on the fit's conversations: "
        + ", ".join(f"{n} {v:.2f}" for n, v in tps.items() if v is not None and not math.isnan(v))
    )
    log(
        "fit-hybrid: the policy's tokens per target step by head depth (the head's passes per step; deeper costs "
        "more head time): " + ", ".join(f"{d}: {v:.3f}" for d, v in by_depth.items() if v is not None)
    )
    log(
        f"fit-hybrid: wrote {path} (temperature {temperature:g}, head depth {policy.depth}; the file holds policies "
        f"for temperatures {', '.join(f'{t:g}' for t in saved.temperatures)})"
    )
    return policy, path


def carry_policy(src: str | Path, dest: str | Path) -> list[float]:
    """Copy the policies fitted next to `src` (a run dir or checkpoint) to `dest`, an export of that same checkpoint:
    a policy fitted on `src`'s head is recorded for `dest`'s digest (the same weights in the serving layout); one
    fitted on anything else keeps its digest, and serving refuses it. Returns the temperatures carried over."""
    from draftsmith.train.checkpoint import head_digest_of

    policies = HybridPolicies.load(src)
    was, now = head_digest_of(src), head_digest_of(dest)
    carried = []
    for p in policies.policies:
        if p.fitted_on.get("head") == was:
            p.fitted_on = {**p.fitted_on, "head": now}
            carried.append(p.temperature)
    policies.save(dest)
    return carried


def records_identity(digest: str, convs, k: int, roles, temperature: float = 0.0) -> dict:
    """What saved per-position records were recorded from (head weights, conversations, k, members, temperature):
    `fit_hybrid` reads a records file back only when its identity equals this."""
    return {
        "format": "draftsmith-hybrid-records-1",
        "head": digest,
        "conversations": hashlib.sha1(json.dumps(convs).encode()).hexdigest(),
        "k": k,
        "roles": list(roles),
        **({"temperature": temperature} if temperature else {}),  # greedy records saved before temperatures match
    }


def _kept_policies(head_dir: Path, digest: str, k: int, temperature: float, log) -> list[HybridPolicy]:
    """The policies already in head_dir/hybrid.json that a new fit at `temperature` keeps beside its own: those at
    other temperatures fitted on the same head weights and k. Others (another head exported into this directory
    since, another k, a file from before policies named their head) are dropped, and the log says so; the one at
    `temperature` is replaced."""
    path = Path(head_dir) / POLICY_FILE
    if not path.is_file():
        return []
    try:
        old = HybridPolicies.load(head_dir)
    except ValueError as e:
        log(f"fit-hybrid: {path} is replaced ({e})")
        return []
    kept = []
    for p in old.policies:
        if p.temperature == temperature:
            continue
        if p.fitted_on.get("head") == digest and p.k == k:
            kept.append(p)
        else:
            why = "another k" if p.k != k else "other head weights (or fitted before policies recorded their head)"
            log(f"fit-hybrid: the policy for temperature {p.temperature:g} in {path} is dropped: {why}")
    return kept


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="draftsmith eval fit-hybrid", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target HF dir, or `smollm2` (the embedded default)")
    p.add_argument("--head", required=True, help="the exported head (or run) directory; hybrid.json is written there")
    p.add_argument(
        "--data",
        default=None,
        help="conversations as training reads them (`sharegpt`, .json, .jsonl, hf:NAME) or a prompt JSONL; the first "
        "user turn of each is answered (default: the head's training data after the conversations it trained on)",
    )
    p.add_argument("--num-conversations", type=positive_int, default=64, help="first turns to fit on (default 64)")
    p.add_argument(
        "--skip",
        type=int,
        default=None,
        help="skip the first N conversations of --data (default 0; without --data, the head's training count)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=256, help="greedy answer length (default 256)")
    p.add_argument("--k", type=positive_int, default=3, help="draft length the policy is fitted for (default 3)")
    p.add_argument("--members", default="head,ngram,suffix", help="comma-separated roles (default all three)")
    p.add_argument("--bins", type=int, default=16, help="signal bins per member (default 16)")
    p.add_argument(
        "--head-depth",
        type=int,
        default=None,
        help="tokens the head drafts when it runs (default --k); suffix and ngram still draft up to --k",
    )
    p.add_argument(
        "--exclude",
        default=None,
        help="a prompts JSONL (e.g. a run's heldout_prompts.jsonl) whose first turns are skipped",
    )
    p.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"], help="who writes the answers")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the target answers at this temperature (default 0: greedy); each temperature fitted is kept in "
        "hybrid.json and requests use the policy fitted nearest their own",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the answers at temperature > 0")
    p.add_argument(
        "--records",
        default=None,
        help="save the per-position records here; a later fit of the same head, data and k reads them back",
    )
    args = p.parse_args(argv)
    fit_hybrid(
        args.target,
        args.head,
        args.data,
        num_conversations=args.num_conversations,
        max_tokens=args.max_tokens,
        k=args.k,
        roles=tuple(r.strip() for r in args.members.split(",") if r.strip()),
        bins=args.bins,
        skip=args.skip,
        backend=args.backend,
        exclude=args.exclude,
        head_depth=args.head_depth,
        records_path=args.records,
        temperature=args.temperature,
        seed=args.seed,
    )
    return 0
