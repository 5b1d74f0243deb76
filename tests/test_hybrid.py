"""The hybrid drafter: calibration and choice on hand-made figures, per-position records that reproduce real
decoding step for step, greedy equality and the sampled output distribution, fitting end to end, the matrix rows."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_reference_decoder import (  # noqa: F401  (one_thread, tiny128 and small_target are fixtures)
    N_SAMPLES,
    PROMPT,
    PROMPTS,
    SMALL_AUX,
    chi2_critical,
    chi_square,
    exact_continuation_probs,
    make_head,
    one_thread,
    plain_greedy,
    sample_counts,
    small_target,
    tiny128,
)

from draftsmith.eval.hybrid import HybridDrafter, _monotone, at_depth, calibrate, fit_policy, record_positions, simulate
from draftsmith.eval.reference_decoder import (
    Eagle3Drafter,
    NgramDrafter,
    NoDrafter,
    SuffixDrafter,
    decode_prompts,
    speculative_generate,
)
from draftsmith.serve.policy import (
    POLICY_FILE,
    Calibration,
    HybridPolicies,
    HybridPolicy,
    Proposal,
    chain_score,
    prompt_key,
)
from draftsmith.train.target import Features


def test_chain_score_and_signals():
    assert chain_score([]) == 0.0
    assert chain_score([0.5, 0.5, 1.0]) == pytest.approx(0.5 + 0.25 + 0.25)
    seq = [7, 8, 9, 1, 7, 8]  # [7, 8] occurred before: ngram matched n=2
    p = NgramDrafter(2, 5).propose(seq, 3, 0.0, None)
    assert p.tokens == [9, 1, 7] and p.signal == 2.0
    assert NgramDrafter(2, 5).propose([1, 2, 3], 3, 0.0, None).signal == 0.0
    s = SuffixDrafter()
    s.start([])
    got = s.propose([4, 5, 6, 4, 5], 2, 0.0, None)  # one occurrence: prob 1 for each of its followers
    assert got.tokens == [6, 4] and got.signal == pytest.approx(2.0)


def test_monotone_and_calibration_hand_made():
    assert _monotone([1.0, 3.0, 2.0], [1, 1, 1]) == [1.0, 2.5, 2.5]
    assert _monotone([2.0, 1.0, 0.0], [1, 1, 2]) == pytest.approx([0.75] * 3)
    assert _monotone([0.0, 1.0], [5, 5]) == [0.0, 1.0]
    # signal 0..3, the accepted count rises with it (with one violation inside a bin pair)
    signals = [0, 0, 1, 1, 2, 2, 3, 3]
    accepted = [0, 0, 2, 2, 1, 1, 3, 3]
    c = calibrate(signals, accepted, bins=4)
    assert c.edges == [0, 1, 2] and c.counts == [2, 2, 2, 2]
    assert c.accepted == [0.0, 1.5, 1.5, 3.0]
    assert [c.expect(s) for s in (-1, 0, 0.5, 1, 2.5, 3, 9)] == [0.0, 0.0, 1.5, 1.5, 3.0, 3.0, 3.0]
    assert calibrate([], [], 4).expect(5.0) == 0.0
    one = calibrate([2.0] * 5, [1] * 5, 8)  # a single distinct signal: one open bin
    assert one.edges == [] and one.accepted == [1.0] and one.counts == [5]


def policy_of(head_bins, suffix_bins=None, ngram_bins=None, k=3):
    members = {"head": Calibration(*head_bins)}
    if suffix_bins:
        members["suffix"] = Calibration(*suffix_bins)
    if ngram_bins:
        members["ngram"] = Calibration(*ngram_bins)
    return HybridPolicy(k=k, members=members)


def test_policy_choice_hand_made():
    pol = policy_of(([0.5], [0.3, 1.2], [10, 10]), ([1.0], [0.4, 2.0], [10, 10]), ([3.0], [0.9, 1.8], [10, 10]))
    P = Proposal
    assert pol.choose({"head": P([1, 2], signal=0.9), "suffix": P([3], signal=2.0), "ngram": P([], signal=0.0)}) == (
        "suffix"
    )
    assert pol.choose({"head": P([1, 2], signal=0.9), "suffix": P([3], signal=0.5), "ngram": P([4], signal=2)}) == (
        "head"
    )
    # equal expectations: the cheaper member (ngram before suffix before head)
    assert pol.choose({"head": P([1], signal=0.9), "suffix": P([3], signal=0.5), "ngram": P([5], signal=5)}) == "ngram"
    # empty drafts never win over a non-empty one, whatever their signal
    assert pol.choose({"head": P([1], signal=0.0), "suffix": P([], signal=9.0), "ngram": P([], signal=9)}) == "head"


def test_head_chain_is_skipped_only_where_no_head_draft_could_be_chosen():
    """Served, the head's chain is not run when `head_can_win` says no: hand-made cases, then on random policies
    and drafts the choice with any head draft at all never falls on the head where the skip says it cannot."""
    pol = policy_of(([0.5], [0.3, 1.2], [10, 10]), ([1.0], [0.4, 2.0], [10, 10]), ([3.0], [0.9, 1.8], [10, 10]))
    P = Proposal
    assert not pol.head_can_win({"suffix": P([3], signal=2.0), "ngram": P([], signal=0.0)})  # 2.0 >= head's best 1.2
    assert pol.head_can_win({"suffix": P([3], signal=0.5), "ngram": P([4], signal=2)})  # 0.9 < 1.2
    assert pol.head_can_win({"suffix": P([], signal=9.0), "ngram": P([], signal=9)})  # nothing drafted
    tie = policy_of(([0.5], [0.3, 1.2], [10, 10]), ngram_bins=([3.0], [1.2, 1.8], [10, 10]))
    assert not tie.head_can_win({"ngram": P([4], signal=2)})  # a tie goes to the cheaper member
    rng = random.Random(0)
    skipped = 0

    def bins():
        return [0.5, 1.5], sorted(rng.choice([0.2, 0.5, 1.0, 1.5, 2.0]) for _ in range(3)), [1, 1, 1]

    for _ in range(400):
        pol = policy_of(bins(), bins(), bins())
        free = {r: P([7] * rng.randint(0, 3), signal=rng.uniform(0, 3)) for r in ("suffix", "ngram")}
        if pol.head_can_win(free):
            continue
        skipped += 1
        for signal in (0.0, 0.6, 1.0, 2.0, 9.0):
            assert pol.choose({"head": P([1, 2, 3], signal=signal), **free}) != "head", (pol, free, signal)
    assert 50 < skipped < 400  # both outcomes occur


def test_policy_file_round_trip_and_errors(tmp_path):
    pol = policy_of(([0.5], [0.3, 1.2], [10, 10]), ([1.0], [0.4, 2.0], [10, 10]))
    pol.fitted_on = {"prompt_keys": [prompt_key([1, 2, 3])], "conversations": 1}
    path = pol.save(tmp_path)
    assert path == tmp_path / POLICY_FILE
    back = HybridPolicies.load(tmp_path)
    assert back == HybridPolicies([pol]) and back.for_temperature(1.0) == pol
    with pytest.raises(ValueError, match="fitted on"):
        back.check_disjoint([[4, 5], [1, 2, 3]], "workload chat")
    back.check_disjoint([[4, 5], [1, 2]], "workload chat")  # no overlap: fine
    with pytest.raises(FileNotFoundError, match="fit-hybrid"):
        HybridPolicies.load(tmp_path / "nothing")
    path.write_text(json.dumps(pol.to_json()))  # a file from before temperatures: one greedy policy
    assert HybridPolicies.load(tmp_path) == HybridPolicies([pol])
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        HybridPolicies.load(tmp_path)
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a draftsmith hybrid policy"):
        HybridPolicies.load(tmp_path)
    bad = pol.to_json()
    bad["members"]["head"]["counts"] = [1]
    path.write_text(json.dumps({"format": "draftsmith-hybrid-2", "policies": [pol.to_json(), bad]}))
    with pytest.raises(ValueError, match="policy 1: member head: 1 edges"):
        HybridPolicies.load(tmp_path)


def test_policies_per_temperature():
    """hybrid.json holds one policy per temperature; a request takes the one fitted nearest its own (greedy: 0),
    and the drafter proposes what that policy chooses."""
    greedy = policy_of(([0.5], [0.3, 1.2], [10, 10]), ([1.0], [0.4, 2.0], [10, 10]))
    hot = policy_of(([0.5], [0.3, 1.2], [10, 10]), ([1.0], [0.1, 0.3], [10, 10]))
    hot.temperature, hot.head_depth = 1.0, 2
    both = HybridPolicies([hot, greedy])
    assert both.temperatures == [0.0, 1.0] and both.k == 3 and both.depth == 3
    assert [both.for_temperature(t) for t in (0.0, 0.4, 0.5, 0.7, 1.0, 2.0)] == [greedy] * 3 + [hot] * 3
    assert HybridPolicies.from_json(json.loads(json.dumps(both.to_json()))) == both
    P = Proposal
    props = {"head": P([1, 2], signal=0.9), "suffix": P([3, 4], signal=2.0)}
    assert greedy.choose(props) == "suffix" and hot.choose(props) == "head"  # suffix is worth less at T=1
    with pytest.raises(ValueError, match="repeat"):
        HybridPolicies([greedy, greedy])
    with pytest.raises(ValueError, match="one k per head"):
        HybridPolicies([greedy, HybridPolicy(k=2, members=hot.members, temperature=1.0)])
    with pytest.raises(ValueError, match="temperature -1"):
        HybridPolicy.from_json(greedy.to_json() | {"temperature": -1})

    class Fixed(NoDrafter):
        def __init__(self, draft):
            self.draft = draft

        def propose(self, tokens, k, temperature, generator):
            return P(self.draft[:k], signal=0.9 if self.draft == [1, 2, 3] else 2.0)

    drafter = HybridDrafter({"head": Fixed([1, 2, 3]), "suffix": Fixed([7, 8, 9])}, both, "hybrid")
    assert drafter.propose([0], 3, 0.0, None).tokens == [7, 8, 9]  # greedy policy: suffix
    assert drafter.propose([0], 3, 1.0, None).tokens == [1, 2]  # T=1 policy: the head, its chain 2 deep


def _sampled_answers(target, prompt, n, length, temperature, seed):
    gen = torch.Generator().manual_seed(seed)
    return [speculative_generate(target, NoDrafter(), prompt, 1, length, temperature, gen) for _ in range(n)]


def test_records_of_sampled_answers_have_the_law_of_sampled_speculative_decoding(small_target):  # noqa: F811
    """fit-hybrid at T > 0 compares greedy drafts with answers sampled at T: a draft token x survives vLLM's
    rejection with probability p(x), and a rejected one is replaced by a draw from p without x, so accepted counts
    have the law of a sampled answer matched position by position. Checked: target steps per answer simulated
    from records of sampled answers equal (in mean) those of real sampled speculative decoding, per member; the
    same records over greedy answers do not (the check has power)."""
    T, n, length, prompt = 1.0, 200, 12, PROMPT

    def members():
        head = Eagle3Drafter(make_head(small_target.model, 4, seed=7, logit_scale=80.0, aux=SMALL_AUX))
        return {"head": head, "ngram": NgramDrafter(1, 2)}

    sampled = _sampled_answers(small_target, prompt, n, length, T, seed=1)
    records = record_positions(small_target, members(), [(prompt, a) for a in sampled], k=3)
    greedy = [plain_greedy(small_target.model, prompt, length)]
    greedy_records = record_positions(small_target, members(), [(prompt, a) for a in greedy], k=3)
    for role in ("head", "ngram"):
        sim = simulate(records, lambda rec, role=role: role)["steps"] / n
        gen = torch.Generator().manual_seed(2)
        steps = []
        for _ in range(n):
            drafter = members()[role]
            _, s = decode_prompts(
                small_target,
                drafter,
                [prompt],
                k=3,
                max_tokens=length,
                temperature=T,
                seed=int(torch.randint(0, 2**31, (1,), generator=gen)),
            )
            steps.append(s["target_steps"] - 1)  # the prefill is not in the records
        mean = sum(steps) / n
        sd = (sum((x - mean) ** 2 for x in steps) / (n - 1)) ** 0.5
        tol = 4 * sd * (2 / n) ** 0.5  # two independent means of n
        assert abs(sim - mean) < tol, (role, sim, mean, tol)
        greedy_sim = simulate(greedy_records, lambda rec, role=role: role)["steps"]
        assert abs(greedy_sim - mean) > tol, (role, greedy_sim, mean, tol)  # greedy answers would mislead


def members_for(model):
    return {"head": Eagle3Drafter(make_head(model, 32, seed=1)), "ngram": NgramDrafter(1, 3), "suffix": SuffixDrafter()}


@pytest.mark.parametrize("parallel", [False, True], ids=["eagle3", "peagle"])
def test_a_heads_chains_drafted_for_every_row_at_once_equal_the_row_by_row_chains(tiny128, parallel):
    """The fit records a head's chain after every position in k batched calls: the tokens and confidences equal
    `propose` after each row (EAGLE-3 chains and P-EAGLE mask slots, two layers, a partial draft vocab), so the
    records are the same either way; and with the batched form the head is never stepped row by row."""
    model = tiny128.model
    kw = {"parallel_drafting": True, "mask_token_id": 3} if parallel else {}
    head = make_head(model, 48, seed=11, logit_scale=20.0, num_layers=2, **kw)  # chains not all one token
    answers = [plain_greedy(model, p, 20) for p in PROMPTS]
    convs = list(zip(PROMPTS, answers))
    seq = PROMPTS[0] + answers[0]
    f = tiny128.step(torch.tensor([seq]), tiny128.new_cache())
    rows = len(seq) - 1
    feats = Features(aux=f.aux[0, :rows], last=f.last[0, :rows], logits=f.logits[0, :rows])
    batched = Eagle3Drafter(head).greedy_every_row(seq[1 : rows + 1], feats, 3)
    stepped = Eagle3Drafter(head)
    stepped.start(seq[:1])
    distinct = set()
    for p in range(rows):
        row = Features(aux=feats.aux[p : p + 1], last=feats.last[p : p + 1], logits=feats.logits[p : p + 1])
        stepped.observe(p, [seq[p + 1]], row)
        want = stepped.propose(seq[: p + 2], 3, 0.0, None)
        assert batched[p].tokens == want.tokens, p
        assert batched[p].confidences == pytest.approx(want.confidences, abs=1e-9)
        assert batched[p].signal == pytest.approx(want.signal, abs=1e-9)
        distinct.add(tuple(want.tokens))
    assert len(distinct) >= 4  # the chains vary from row to row: the comparison has power

    def members():
        return {"head": Eagle3Drafter(head), "suffix": SuffixDrafter()}

    fast = record_positions(tiny128, members(), convs, k=3)
    slow = record_positions(tiny128, members(), convs, k=3, batched=False)
    assert_records_close(fast, slow)
    calls = []
    counted = Eagle3Drafter(head)
    counted.propose = lambda *a: calls.append(a)
    record_positions(tiny128, {"head": counted}, convs[:1], k=3)
    assert calls == []


def assert_records_close(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for rx, ry in zip(x, y):
            assert rx.keys() == ry.keys()
            for role in rx:
                assert rx[role]["n"] == ry[role]["n"] and rx[role]["accepted"] == ry[role]["accepted"]
                assert rx[role]["signal"] == pytest.approx(ry[role]["signal"], abs=1e-9)
                assert rx[role].get("p") == pytest.approx(ry[role].get("p"), abs=1e-6)


def test_records_reproduce_real_decoding_and_the_fitted_hybrid_decodes_as_simulated(tiny128):
    """Teacher-forced records over the greedy answers predict every member's decode exactly (target steps per
    prompt), and the fitted policy, served by the reference decoder, takes the steps the simulation says."""
    model = tiny128.model
    n = 24
    answers = [plain_greedy(model, p, n) for p in PROMPTS]
    records = record_positions(tiny128, members_for(model), list(zip(PROMPTS, answers)), k=3)
    assert [len(r) for r in records] == [n - 1] * len(PROMPTS)
    for role in ("head", "ngram", "suffix"):
        _, s = decode_prompts(tiny128, members_for(model)[role], PROMPTS, k=3, max_tokens=n)
        sim = simulate(records, lambda rec, role=role: role)
        assert sim["steps"] == s["target_steps"] - len(PROMPTS), role  # the prefills are not in the records
    policy, figures = fit_policy(records, k=3, bins=4)
    assert set(policy.members) == {"head", "ngram", "suffix"}
    alone = [figures[r]["tokens_per_step"] for r in ("head", "ngram", "suffix")]
    assert figures["oracle"]["tokens_per_step"] >= max(alone)
    assert figures["policy"]["tokens_per_step"] <= figures["oracle"]["tokens_per_step"]

    hybrid = HybridDrafter(members_for(model), policy, "hybrid")
    outs, s = decode_prompts(tiny128, hybrid, PROMPTS, k=3, max_tokens=n)
    assert outs == answers  # greedy output unchanged
    assert s["target_steps"] - len(PROMPTS) == figures["policy"]["steps"]
    given = {r: hybrid.sources[hybrid._label(r)]["steps"] for r in ("head", "ngram", "suffix")}
    assert {r: v for r, v in given.items() if v} == figures["policy"]["chosen"]
    assert sum(v["accepted_tokens"] for v in hybrid.sources.values()) == s["counters"]["num_accepted_tokens"]
    assert sum(v["draft_tokens"] for v in hybrid.sources.values()) == s["counters"]["num_draft_tokens"]
    assert len([v for v in given.values() if v]) >= 2  # the policy really mixed members on this target


def test_records_of_an_mlp_speculator_reproduce_real_decoding(tiny128):
    """The same for an MLP speculator as the hybrid's head (what `--family mlp --hybrid` fits): its records predict
    its decode step for step, and the fitted hybrid decodes as simulated with greedy output unchanged."""
    from test_reference_decoder import make_mlp

    from draftsmith.eval.reference_decoder import MLPSpeculatorDrafter

    model = tiny128.model

    def members():
        return {"head": MLPSpeculatorDrafter(make_mlp(model, 3, seed=2)), "ngram": NgramDrafter(1, 3),
                "suffix": SuffixDrafter()}  # fmt: skip

    n = 24
    answers = [plain_greedy(model, p, n) for p in PROMPTS]
    records = record_positions(tiny128, members(), list(zip(PROMPTS, answers)), k=3)
    _, s = decode_prompts(tiny128, members()["head"], PROMPTS, k=3, max_tokens=n)
    assert simulate(records, lambda rec: "head")["steps"] == s["target_steps"] - len(PROMPTS)
    assert s["counters"]["num_draft_tokens"] > 0
    policy, figures = fit_policy(records, k=3, bins=4)
    outs, s = decode_prompts(tiny128, HybridDrafter(members(), policy, "hybrid"), PROMPTS, k=3, max_tokens=n)
    assert outs == answers
    assert s["target_steps"] - len(PROMPTS) == figures["policy"]["steps"]


def test_a_shorter_head_chain_is_exact_from_the_full_records_and_decodes_as_simulated(tiny128):
    """Records at k=3 cut to head depth d equal records made with the head drafting d tokens (its first d greedy
    tokens do not depend on the chain's length); a policy fitted at depth 1 drafts one head token per step in the
    reference decoder (suffix and ngram still up to k), takes the simulated steps and keeps greedy output."""
    model = tiny128.model
    n = 24
    answers = [plain_greedy(model, p, n) for p in PROMPTS]
    convs = list(zip(PROMPTS, answers))
    full = record_positions(tiny128, members_for(model), convs, k=3)
    assert all(len(rec["head"]["p"]) == rec["head"]["n"] == 3 for recs in full for rec in recs)
    for d in (1, 2):
        short = record_positions(tiny128, {"head": members_for(model)["head"]}, convs, k=d)
        cut = at_depth(full, d)
        assert [[rec["head"]["n"] for rec in r] for r in cut] == [[rec["head"]["n"] for rec in r] for r in short]
        assert [[rec["head"]["accepted"] for rec in r] for r in cut] == [
            [rec["head"]["accepted"] for rec in r] for r in short
        ]
        got = [rec["head"]["signal"] for r in cut for rec in r]
        assert got == pytest.approx([rec["head"]["signal"] for r in short for rec in r], abs=1e-5)
    # not vacuous: the cut changes the head's signal (a shorter chain score); accepted counts are cut too
    hand = {"head": {"n": 3, "signal": 0.9 + 0.72 + 0.504, "accepted": 3, "p": [0.9, 0.8, 0.7]}, "ngram": {"n": 0}}
    assert at_depth([[hand]], 1) == [[{"head": {"n": 1, "signal": 0.9, "accepted": 1, "p": [0.9]}, "ngram": {"n": 0}}]]
    assert at_depth([[hand]], 2)[0][0]["head"]["accepted"] == 2 and at_depth([[hand]], 3) == [[hand]]
    one = at_depth(full, 1)
    assert sum(a["head"]["signal"] < b["head"]["signal"] - 1e-6 for x, y in zip(one, full) for a, b in zip(x, y)) > 10

    policy, figures = fit_policy(full, k=3, bins=4, head_depth=1)
    assert policy.head_depth == 1 and policy.depth == 1
    assert HybridPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy
    hybrid = HybridDrafter(members_for(model), policy, "hybrid")
    outs, s = decode_prompts(tiny128, hybrid, PROMPTS, k=3, max_tokens=n)
    assert outs == answers
    assert s["target_steps"] - len(PROMPTS) == figures["policy"]["steps"]
    head = hybrid.sources[hybrid._label("head")]
    assert head["steps"] > 0 and head["draft_tokens"] == head["steps"]  # one head token per step it was chosen
    assert max(s["counters"]["num_accepted_tokens_per_pos"][1:]) > 0  # suffix/ngram still drafted beyond it
    bad = policy.to_json() | {"head_depth": 4}
    with pytest.raises(ValueError, match="head_depth 4 outside"):
        HybridPolicy.from_json(bad)
    with pytest.raises(ValueError, match="per-token confidences"):
        at_depth([[{"head": {"n": 3, "signal": 1.0, "accepted": 2}}]], 1)


def test_hybrid_sampled_output_distribution_equals_target(small_target):  # noqa: F811
    """At temperature 1 the per-step choice keeps the target's distribution (chi-square over whole outputs)."""
    head = Eagle3Drafter(make_head(small_target.model, 4, seed=7, logit_scale=80.0, aux=SMALL_AUX), "sample")
    # the head when it is sure, else ngram: a choice that changes with the context
    policy = policy_of(([0.8], [0.0, 3.0], [1, 1]), ngram_bins=([], [1.0], [1]))
    drafter = HybridDrafter({"head": head, "ngram": NgramDrafter(1, 2)}, policy, "hybrid")
    probs = exact_continuation_probs(small_target, PROMPT, 1.0)
    counts = sample_counts(small_target, drafter, PROMPT, N_SAMPLES, 1.0)
    stat, dof = chi_square(counts, probs, N_SAMPLES)
    assert dof >= 10
    assert stat < chi2_critical(dof), (stat, dof)
    assert all(v["steps"] > 0 for v in drafter.sources.values()), drafter.sources  # both members were used


TRAIN = [
    {"prompt": "List the colours twice: red, green, blue, red, green, blue."},
    {"prompt": "Say hello three times in a row, please."},
    {"messages": [{"role": "user", "content": "Count from one to ten in words: one, two, three."}]},
]


def test_fit_hybrid_end_to_end_and_the_matrix_rows(tiny_target_dir, tmp_path, capsys):
    """fit-hybrid on training first turns writes hybrid.json next to the head; the matrix then runs hybrid(NAME)
    in the reference decoder at every temperature (greedy output unchanged, one choice per round, the oracle over
    the same members beside it) and refuses evaluation prompts the policy was fitted on."""
    from test_matrix import REPETITIVE, tiny_head_run

    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.eval.hybrid import main as fit_main
    from draftsmith.eval.matrix import run_matrix

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    held_out = tmp_path / "rep.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in REPETITIVE))
    head = tiny_head_run(tmp_path / "run", tiny_target_dir)
    excluded = tmp_path / "heldout_prompts.jsonl"  # a run's held-out prompts that also sit in the data file
    excluded.write_text(json.dumps(TRAIN[1]) + "\n")
    argv = ["--target", str(tiny_target_dir), "--head", str(head), "--data", str(train), "--max-tokens", "24"]
    argv += ["--num-conversations", "3", "--backend", "hf", "--exclude", str(excluded)]
    records = tmp_path / "records.json"
    # first at head depth 1 with the records saved, then the full depth from the saved records (no forward pass)
    assert fit_main([*argv, "--head-depth", "1", "--records", str(records)]) == 0
    short = HybridPolicies.load(head).for_temperature(0)
    assert short.depth == 1 and "records saved" in capsys.readouterr().out
    assert fit_main([*argv, "--records", str(records)]) == 0
    assert "read back" in capsys.readouterr().out
    policy = HybridPolicies.load(head).for_temperature(0)
    fit = policy.fitted_on
    assert policy.depth == 3 and policy.head_depth is None
    assert fit["conversations"] == 2 and len(fit["prompt_keys"]) == 2 and fit["positions"] > 0
    assert set(fit["tokens_per_step"]) == {"head", "ngram", "suffix", "policy", "oracle"}
    assert fit["tokens_per_step"]["oracle"] >= max(fit["tokens_per_step"][r] for r in ("head", "ngram", "suffix"))
    by_depth = fit["policy_tokens_per_step_by_head_depth"]
    assert (
        by_depth["3"] == fit["tokens_per_step"]["policy"]
        and by_depth["1"] == short.fitted_on["tokens_per_step"]["policy"]
    )
    assert fit_main([*argv, "--records", str(records), "--k", "2"]) == 0  # other k: the records are not reused
    assert "recording anew" in capsys.readouterr().out
    assert fit_main([*argv, "--records", str(records)]) == 0  # back to k=3 for the matrix below
    capsys.readouterr()
    # a policy for sampled requests joins the greedy one: answers sampled at T=1, their own records
    assert fit_main([*argv, "--temperature", "1", "--records", str(tmp_path / "records_t1.json")]) == 0
    out = capsys.readouterr().out
    assert "at temperature 1 (seed 0)" in out and "temperatures 0, 1" in out
    both = HybridPolicies.load(head)
    assert both.temperatures == [0.0, 1.0] and both.for_temperature(0) == HybridPolicies.load(head).policies[0]
    hot = both.for_temperature(1.0)
    assert hot.fitted_on["temperature"] == 1.0 and hot.fitted_on["head"] == fit["head"]
    assert hot.fitted_on["positions"] > 0 and hot.fitted_on["prompt_keys"] == fit["prompt_keys"]
    assert both.for_temperature(0).fitted_on == {**fit, "head": fit["head"]}  # the greedy policy was kept as it was

    kw = dict(ks=[3], max_tokens=24, num_prompts=2, served=False)
    r = run_matrix(
        str(tiny_target_dir),
        [f"rep={held_out}"],
        ["none", "ngram", "suffix"],
        {"h": str(head)},
        temperatures=[0.0, 1.0],
        out_dir=str(tmp_path / "m"),
        **kw,
    )
    name = "hybrid(h)"
    assert name in r["methods"] and r["hybrids"][name]["members"] == ["h", "ngram", "suffix"]
    cells = {c["temperature"]: c for c in r["cells"] if c["method"] == name}
    assert set(cells) == {0.0, 1.0}
    assert cells[0.0]["match_vs_none"] == 1.0
    for c in cells.values():
        src = c["hybrid_sources"]
        assert set(src) == {"h", "ngram", "suffix"}
        assert sum(v["steps"] for v in src.values()) == c["target_steps"] - 2  # one choice per round, 2 prompts
        assert sum(v["accepted_tokens"] for v in src.values()) == c["counters"]["num_accepted_tokens"]
    rows = {row["temperature"]: row for row in r["hybrid"]}
    assert rows[0.0]["oracle"] == "oracle(h+ngram+suffix)" and rows[0.0]["oracle_tokens_per_target_step"] >= 1.0
    assert rows[1.0]["oracle"] is None  # the oracle runs greedy only
    report = (tmp_path / "m" / "report.md").read_text()
    assert "## Hybrid" in report and name in report and "2 conversations of `train.jsonl`, head chain 3 deep" in report
    assert "policies fitted at T = 0, 1" in report and r["hybrids"][name]["temperatures"] == [0.0, 1.0]

    def greedy_ngram_matrix(workload: str, out: str, **extra) -> dict:
        return run_matrix(
            str(tiny_target_dir),
            [workload],
            ["ngram"],
            {"h": str(head)},
            temperatures=[0.0],
            out_dir=str(tmp_path / out),
            **kw,
            **extra,
        )

    with pytest.raises(ValueError, match="fitted on"):
        greedy_ngram_matrix(f"train={train}", "x")
    greedy_ngram_matrix(f"heldout={excluded}", "z")  # the excluded prompt was never fitted on: evaluating on it is fine
    served = {"h": str(tmp_path / "z" / "heads" / "h")}  # the matrix's export of the head, hybrid.json beside it
    with pytest.raises(ValueError, match=r"for hybrid\(h\): prompts \[0\] \(1 of 2\).*fitted on"):  # served too
        run_acceptance(str(tiny_target_dir), str(train), [], served, k=3, max_tokens=8, num_prompts=2,
                       out_dir=str(tmp_path / "served"), hybrids=("h",))  # fmt: skip
    off = greedy_ngram_matrix(f"train={train}", "y", hybrid=False)
    assert off["hybrids"] == {} and not off["hybrid"]
    capsys.readouterr()
    assert fit_main([*argv, "--k", "2"]) == 0  # one k per file: the T=1 policy fitted at k=3 goes
    assert "policy for temperature 1 in" in capsys.readouterr().out
    assert HybridPolicies.load(head).temperatures == [0.0] and HybridPolicies.load(head).k == 2


def test_fit_data_defaults_to_conversations_the_head_did_not_train_on(tiny_target_dir, tmp_path, capsys):
    """Without --data the fit reads the head's own training data after the conversations it trained on (from its
    run's config.yaml, or the export's draftsmith.json); --data over those training conversations warns."""
    import yaml
    from test_matrix import tiny_head_run

    from draftsmith.cli import main as cli
    from draftsmith.errors import ConfigError
    from draftsmith.eval.hybrid import fit_data
    from draftsmith.eval.hybrid import main as fit_main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TRAIN + [{"prompt": "Name two even numbers: two, four."}]))
    run = tiny_head_run(tmp_path / "run", tiny_target_dir)
    with pytest.raises(ConfigError, match="does not record what it was trained on: give --data"):
        fit_data(run, None, None)
    config = {"data": {"path": str(data), "num_conversations": 2}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    exported = tmp_path / "exported"
    assert cli(["export", "--format", "vllm", str(run), str(exported)]) == 0
    capsys.readouterr()
    assert json.loads((exported / "draftsmith.json").read_text())["trained_on"] == {
        "data": str(data),
        "conversations": 2,
    }
    for head in (run, exported):
        lines = []
        assert fit_data(head, None, None, lines.append) == (str(data), 2)
        assert "trained on the first 2 conversations" in lines[0]
        lines = []
        assert fit_data(head, str(data), None, lines.append) == (str(data), 0)
        assert "warning" in lines[0] and "--skip 2" in lines[0]
        lines = []
        assert fit_data(head, str(data), 2, lines.append) == (str(data), 2) and lines == []
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"path": "regen:sharegpt", "num_conversations": 2000}}))
    assert fit_data(run, None, None, lambda _: None) == ("sharegpt", 2000)  # regen:SOURCE trains on SOURCE's turns
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"path": str(data), "num_conversations": None}}))
    with pytest.raises(ConfigError, match="trained on all of"):
        fit_data(run, None, None)
    # end to end: the default fits on the conversations after the head's two, as --data FILE --skip 2 does
    common = ["--target", str(tiny_target_dir), "--max-tokens", "16", "--num-conversations", "2", "--backend", "hf"]
    assert fit_main([*common, "--head", str(exported)]) == 0
    by_default = HybridPolicies.load(exported).for_temperature(0).fitted_on
    assert f"2 first turns of {data}" in capsys.readouterr().out
    assert fit_main([*common, "--head", str(exported), "--data", str(data), "--skip", "2"]) == 0
    explicit = HybridPolicies.load(exported).for_temperature(0).fitted_on
    assert by_default["prompt_keys"] == explicit["prompt_keys"] and len(explicit["prompt_keys"]) == 2
    assert fit_main([*common, "--head", str(exported), "--data", str(data)]) == 0  # the first two: others
    assert HybridPolicies.load(exported).for_temperature(0).fitted_on["prompt_keys"] != explicit["prompt_keys"]
