"""Reference speculative decoder: exact greedy equality, the sampled output distribution, the rejection
rule on hand-made distributions, the baselines' proposals, the speedup formula."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import build_tiny_llama
from reference import single_query_step

from draftsmith.eval import reference_decoder as rd
from draftsmith.eval.baselines import SuffixIndex, ngram_propose
from draftsmith.eval.reference_decoder import (
    DecodeStats,
    Eagle3Drafter,
    MLPSpeculatorDrafter,
    NgramDrafter,
    NoDrafter,
    OracleDrafter,
    SuffixDrafter,
    alpha_from_tau,
    decode_prompts,
    expected_speedup,
    expected_tokens_per_step,
    recommend_k,
    speculative_generate,
    verify_greedy,
    verify_sampled,
)
from draftsmith.serve.policy import Proposal
from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.target import Target

AUX = [1, 3, 4]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Batch-1 decoding of tiny models: one thread (2 threads on a loaded 2-core machine ran ~100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_head(model, draft_vocab_size, seed=0, logit_scale=1.0, aux=AUX, **config):
    torch.manual_seed(seed)
    cfg = Eagle3Config.from_target(model.config, draft_vocab_size, aux, **config)
    head = Eagle3Head(cfg)
    head.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.float())
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    ids = torch.randperm(V)[:Vd].sort().values  # a partial draft vocab exercises d2t
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab(ids - torch.arange(Vd), t2d)
    head.lm_head.weight.data *= logit_scale
    return head.double().eval()


def make_mlp(model, n_predict=5, seed=0):
    from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

    torch.manual_seed(seed)
    return MLPSpeculator(MLPSpeculatorConfig.from_target(model.config, n_predict=n_predict)).double().eval()


def test_mlp_speculator_adapter_proposes_what_the_head_proposes(tiny128):
    mlp = make_mlp(tiny128.model, n_predict=3)
    prompt = PROMPTS[0]
    f = tiny128.features(torch.tensor([prompt]))
    first = int(f.logits[0, -1].argmax())
    drafter = MLPSpeculatorDrafter(mlp)
    drafter.start(prompt)
    drafter.observe(0, prompt[1:] + [first], rd.Features(aux=f.aux[0], last=f.last[0], logits=f.logits[0]))
    got = drafter.propose(prompt + [first], 5, 0.0, None)  # capped at n_predict
    assert got.tokens == mlp.propose(f.last[0, -1:], torch.tensor([first]), 3)[0].tolist()
    # the probabilities the served hybrid reads from the head (its chain signal) are the ones the fit records
    tokens, probs = mlp.propose(f.last[0, -1:], torch.tensor([first]), 3, probs=True)
    assert tokens[0].tolist() == got.tokens
    assert probs[0].tolist() == pytest.approx(got.confidences, rel=1e-9)


@pytest.fixture(scope="module")
def tiny128():
    return Target(build_tiny_llama(vocab_size=128, seed=3).double(), AUX)


def plain_greedy(model, prompt, n):
    """Greedy decoding by full recomputation: no cache, no speculation."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


PROMPTS = [[5, 9, 17, 5, 9, 17, 5, 9], [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], [40, 41, 42, 43, 44, 45, 40, 41, 42, 43]]


def test_greedy_equals_plain_decoding_for_every_drafter(tiny128):
    model = tiny128.model
    head = make_head(model, 32, seed=1)
    expected = [plain_greedy(model, p, 24) for p in PROMPTS]
    drafters = [
        NoDrafter(),
        NgramDrafter(2, 5),
        NgramDrafter(1, 3),
        SuffixDrafter(),
        Eagle3Drafter(head),
        Eagle3Drafter(head, draft_sampling="sample"),
        MLPSpeculatorDrafter(make_mlp(model)),
    ]
    for drafter in drafters:
        for k in (1, 4):
            outs, s = decode_prompts(tiny128, drafter, PROMPTS, k=k, max_tokens=24)
            assert outs == expected, (drafter.name, k)
            c = s["counters"]
            if not isinstance(drafter, NoDrafter):
                assert c["num_drafts"] > 0, (drafter.name, k)  # the check above exercised verification
                assert sum(c["num_accepted_tokens_per_pos"]) == c["num_accepted_tokens"] <= c["num_draft_tokens"]
                # each round emits 1 + accepted tokens; prefill emits one; the last round may overshoot max_tokens
                assert s["generated_tokens"] <= s["target_steps"] + c["num_accepted_tokens"]
            else:
                assert s["target_steps"] == 3 * 24  # one forward per token


def test_ngram_accepts_on_a_looping_target(tiny128):
    # a random tiny model falls into short loops under greedy decoding: prompt lookup must find them
    outs, s = decode_prompts(tiny128, NgramDrafter(1, 3), PROMPTS, k=3, max_tokens=48)
    assert s["counters"]["num_accepted_tokens"] > 0 and s["tokens_per_target_step"] > 1.0


@pytest.mark.parametrize("norm_output", [False, True])
def test_eagle3_drafter_follows_vllm_draft_semantics(tiny128, norm_output):
    """Proposals equal the head's TTT steps computed one query at a time (the path the vLLM contract test pins);
    with norm_output a step reads the previous step's state after the final norm (vLLM's aux_output)."""
    model = tiny128.model
    head = make_head(model, 32, seed=2, norm_output=norm_output)
    with torch.no_grad():
        head.norm.weight.uniform_(0.5, 2.0)  # not the identity on normed states
    prompt = PROMPTS[1]
    f = tiny128.features(torch.tensor([prompt]))
    first = int(f.logits[0, -1].argmax())
    ids = torch.tensor([prompt + [first]])
    n = len(prompt)
    drafter = Eagle3Drafter(head)
    drafter.start(prompt)
    # two observe() calls (prefix split) must equal one: the incremental draft cache is exact
    drafter.observe(0, ids[0, 1:6].tolist(), rd.Features(aux=f.aux[0, :5], last=f.last[0, :5], logits=f.logits[0, :5]))
    drafter.observe(5, ids[0, 6:].tolist(), rd.Features(aux=f.aux[0, 5:], last=f.last[0, 5:], logits=f.logits[0, 5:]))
    got = drafter.propose(ids[0].tolist(), 3, 0.0, None)
    want, conf = [], []
    with torch.no_grad():
        cache = head.ttt_cache()
        h = head(ids[:, 1:], torch.arange(n)[None], head.fuse(f.aux), cache)[:, -1:]
        cache = cache[0]  # the one layer's (keys, values) per step
        for step in range(3):
            p = head.logits(h)[0, -1].softmax(-1)
            tok = head.draft_to_target[p.argmax()].view(1, 1)
            want.append(int(tok))
            conf.append(float(p.max()))
            cache[:] = [cache[0]] + [(k[..., -1:, :], v[..., -1:, :]) for k, v in cache[1:]]
            h = single_query_step(head, tok, torch.tensor([[n + step]]), head.norm(h) if norm_output else h, cache)
    assert got.tokens == want
    assert got.confidences == pytest.approx(conf, rel=1e-5)  # their probabilities (float32 there): the states too


# ---------------------------------------------------------------- the sampled distribution


SMALL_V, CONT, SMALL_AUX, LOGIT_SCALE = 6, 3, [0, 1, 2], 20.0


@pytest.fixture(scope="module")
def small_target():
    """Three layers, H 64, vocab 6: ~3 ms a sample, so a chi-square over ~1k samples takes seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    cfg = LlamaConfig(
        vocab_size=SMALL_V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(cfg).double().eval()
    model.get_output_embeddings().weight.data *= LOGIT_SCALE  # peaked: a few dozen outcomes carry the mass
    return Target(model, SMALL_AUX)


def exact_continuation_probs(target, prompt, temperature):
    seqs = torch.tensor(list(itertools.product(range(SMALL_V), repeat=CONT)))  # [V^3, 3]
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logp = torch.log_softmax(target.model(ids).logits.double() / temperature, -1)  # [N, T, V]
    P = len(prompt)
    lp = sum(logp[:, P - 1 + i].gather(-1, seqs[:, i : i + 1])[:, 0] for i in range(CONT))
    return {tuple(s.tolist()): float(p) for s, p in zip(seqs, lp.exp())}


def chi_square(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic with outcomes of expected count < 5 pooled into one bin; (statistic, dof)."""
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for key, p in probs.items():
        e, o = n * p, counts.get(key, 0)
        if e >= 5:
            stat += (o - e) ** 2 / e
            dof += 1
        else:
            pooled_obs += o
            pooled_exp += e
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return stat, dof


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Upper 0.1 % point of χ²(dof), Wilson–Hilferty."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def sample_counts(target, drafter, prompt, n, temperature, seed=0):
    gen = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(n):
        out = tuple(
            speculative_generate(target, drafter, prompt, k=2, max_tokens=CONT, temperature=temperature, generator=gen)
        )
        counts[out] = counts.get(out, 0) + 1
    return counts


PROMPT = [1, 3, 0, 2, 5]
N_SAMPLES = 600


@pytest.mark.parametrize("kind", ["eagle3_sampled_drafts", "ngram"])
def test_sampled_output_distribution_equals_target(small_target, kind):
    T = 1.0
    if kind == "ngram":
        drafter = NgramDrafter(1, 2)  # deterministic drafts: q one-hot
    else:
        head = make_head(small_target.model, 4, seed=7, logit_scale=80.0, aux=SMALL_AUX)
        drafter = Eagle3Drafter(head, draft_sampling="sample")
    probs = exact_continuation_probs(small_target, PROMPT, T)
    assert abs(sum(probs.values()) - 1) < 1e-9
    counts = sample_counts(small_target, drafter, PROMPT, N_SAMPLES, T)
    stat, dof = chi_square(counts, probs, N_SAMPLES)
    assert dof >= 10
    assert stat < chi2_critical(dof), (stat, dof)


def test_chi_square_catches_a_biased_verifier(small_target, monkeypatch):
    """The statistical test has power: resampling from p instead of the residual skews the output."""

    def biased(draft, q, p, generator):
        for i, d in enumerate(draft):
            if torch.rand((), generator=generator, dtype=p.dtype) >= p[i, d]:
                return i, rd._sample(p[i], generator)  # wrong: may re-emit the rejected token
        return len(draft), rd._sample(p[len(draft)], generator)

    monkeypatch.setattr(rd, "verify_sampled", biased)
    probs = exact_continuation_probs(small_target, PROMPT, 1.0)
    counts = sample_counts(small_target, NgramDrafter(1, 2), PROMPT, N_SAMPLES, 1.0)
    stat, dof = chi_square(counts, probs, N_SAMPLES)
    assert stat > chi2_critical(dof), (stat, dof)


# ---------------------------------------------------------------- rejection rule on hand-made distributions


def test_verify_greedy_hand_made():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 2.0]])  # argmax 1, 0, 2
    assert verify_greedy([1, 0], logits) == (2, 2)  # all accepted + bonus
    assert verify_greedy([1, 2], logits) == (1, 0)  # second rejected, corrected to the target's argmax
    assert verify_greedy([0, 0], logits) == (0, 1)
    assert verify_greedy([], logits[:1]) == (0, 1)


def test_rejection_rule_matches_target_distribution_one_position():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    n, first, accepted = 20000, torch.zeros(4), 0
    for _ in range(n):
        d = int(torch.multinomial(q[0], 1, generator=gen))
        acc, tok = verify_sampled([d], q, p, gen)
        first[d if acc == 1 else tok] += 1
        accepted += acc
    # the first output token is distributed as p[0]; acceptance probability is Σ min(p, q) = 0.1+0.3+0.2+0 = 0.6
    assert torch.allclose(first / n, p[0].float(), atol=0.015), first / n
    assert abs(accepted / n - 0.6) < 0.015
    assert first[3] == 0  # a token the target gives probability 0 is never emitted, though the draft proposes it


def test_rejection_with_one_hot_draft():
    p = torch.tensor([[0.25, 0.75, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    res = [verify_sampled([1], None, p, gen) for _ in range(8000)]
    acc = sum(a for a, _ in res) / len(res)
    assert abs(acc - 0.75) < 0.02  # accepted with p(d)
    assert {t for a, t in res if a == 0} == {0}  # residual p - onehot(1) leaves only token 0
    assert {t for a, t in res if a == 1} == {0}  # bonus from p[1]
    # q = p: never rejects
    assert all(verify_sampled([1], p[:1], p, gen)[0] == 1 for _ in range(200))
    # the draft proposes a token the target rules out: always rejected
    assert all(verify_sampled([2], None, p, gen)[0] == 0 for _ in range(200))


# ---------------------------------------------------------------- baselines


def test_ngram_proposals_hand_made():
    # tail [7, 8] occurs at 1 and 5: the earliest wins; its follower run continues into the tail itself
    seq = [6, 7, 8, 9, 1, 7, 8, 2, 7, 8]
    assert ngram_propose(seq, 3, 2, 5) == [9, 1, 7]
    # longer matches beat earlier ones: tail [2, 7, 8] occurs only... nowhere earlier, [7, 8] does
    assert ngram_propose([3, 4, 5, 0, 4, 5, 9, 3, 4, 5], 2, 2, 5) == [0, 4]  # [3,4,5] matched (len 3)
    assert ngram_propose([1, 2, 3, 4], 3, 2, 5) == []  # no earlier occurrence
    assert ngram_propose([1, 2, 1], 3, 1, 5) == [2, 1]  # min_n 1: [1] at 0; only 2 tokens follow
    assert ngram_propose([1, 2, 1], 3, 2, 5) == []
    assert ngram_propose([5, 5, 5, 5], 4, 2, 3) == [5]  # [5,5,5] earliest at 0: one follower left
    assert ngram_propose([1, 2, 3, 1, 2], 0, 2, 5) == []
    assert ngram_propose([1], 3, 2, 5) == []


def test_suffix_proposals_hand_made():
    idx = SuffixIndex(max_depth=24, max_spec_factor=1.0, min_token_prob=0.1)
    # context tail [4, 5] matches twice, followed by 6 both times, then 7 (twice): budget = match length 2
    assert idx.propose([4, 5, 6, 7, 0, 4, 5, 6, 7, 1, 4, 5], 5) == [6, 7]
    idx2 = SuffixIndex(max_spec_factor=4.0)
    assert idx2.propose([4, 5, 6, 7, 0, 4, 5, 6, 7, 1, 4, 5], 5) == [6, 7, 0, 4, 5]  # 0 vs 1 tie -> lowest id (p .5)
    # frequency: after [9], 3 follows twice and 8 once -> 3 (prob 2/3); min_token_prob stops a weak chain
    idx3 = SuffixIndex(max_spec_factor=3.0, min_token_prob=0.5)
    assert idx3.propose([9, 3, 0, 9, 8, 1, 9, 3, 2, 9], 3) == [3]  # then [9,3] -> 0 or 2 at 1/2: 2/3*1/2 < .5
    # earlier outputs are part of the corpus
    idx4 = SuffixIndex()
    assert idx4.propose([10, 11], 3) == []
    idx4.remember([10, 11, 12, 13])
    assert idx4.propose([20, 10, 11], 3) == [12, 13]  # match length 2 caps the budget at 2
    assert idx4.propose([20], 3) == []


# ---------------------------------------------------------------- oracle


class Fixed(rd.Drafter):
    """Proposes what it is told; records what it observed."""

    def __init__(self, name, draft):
        self.name, self.draft, self.seen = name, draft, []

    def observe(self, start, next_tokens, feats):
        self.seen.append((start, list(next_tokens)))

    def propose(self, tokens, k, temperature, generator):
        return Proposal(self.draft[:k])


def test_oracle_picks_the_draft_accepted_furthest_hand_made():
    prompt, greedy = [1, 2], [10, 11, 12, 13, 14]
    a, b, c = Fixed("a", [11, 12, 99]), Fixed("b", [11, 12, 13]), Fixed("c", [])
    oracle = OracleDrafter({"a": a, "b": b, "c": c}, {(1, 2): greedy}, "oracle(a+b+c)")
    oracle.start(prompt)
    oracle.observe(0, [2, 10], None)
    assert a.seen == b.seen == c.seen == [(0, [2, 10])]  # every member observes every step
    assert oracle.propose(prompt + [10], 3, 0.0, None).tokens == [11, 12, 13]  # b: 3 accepted against a's 2
    assert oracle.propose(prompt + [10, 11], 3, 0.0, None).tokens == []  # nothing accepted: the empty draft
    b.draft = [99]
    a.draft = [12, 7]
    assert oracle.propose(prompt + [10, 11], 3, 0.0, None).tokens == [12, 7]  # a: 1 accepted
    a.draft = [12]
    b.draft = [12, 13, 14]
    assert oracle.propose(prompt + [10, 11], 2, 0.0, None).tokens == [12, 13]  # k caps the draft: 2 > 1
    a.draft = b.draft = [14, 0]
    assert oracle.propose(prompt + [10, 11, 12, 13], 2, 0.0, None).tokens == [14, 0]  # the greedy output ends
    assert oracle.sources == {
        "a": {"steps": 2, "draft_tokens": 4, "accepted_tokens": 2},  # ties go to the first member
        "b": {"steps": 2, "draft_tokens": 5, "accepted_tokens": 5},
        "c": {"steps": 1, "draft_tokens": 0, "accepted_tokens": 0},
    }
    with pytest.raises(ValueError, match="greedy"):
        oracle.propose(prompt + [10], 3, 1.0, None)
    with pytest.raises(ValueError, match="no greedy output"):
        oracle.start([7, 7])
    with pytest.raises(ValueError, match="two drafters"):
        OracleDrafter({"a": a}, {}, "oracle(a)")


def test_oracle_on_a_model_wins_each_step_and_verification_agrees(tiny128):
    """On a real (tiny) target: the output stays greedy decoding's, the acceptance the oracle predicted is what
    verification accepted, and each step's choice accepts at least as far as every member's draft there."""
    model = tiny128.model
    longer = [plain_greedy(model, p, 24 + 3) for p in PROMPTS]  # a last draft may run past max_tokens
    expected = [e[:24] for e in longer]
    refs = {tuple(p): e for p, e in zip(PROMPTS, longer)}
    members = {
        "eagle3": Eagle3Drafter(make_head(model, 32, seed=1)),
        "ngram": NgramDrafter(1, 3),
        "suffix": SuffixDrafter(),
    }
    per_step = []

    class Checked(OracleDrafter):
        def propose(self, tokens, k, temperature, generator):
            ahead = self._ahead[len(tokens) - self._prompt_len :]
            drafts = [d.propose(tokens, k, temperature, generator).tokens[:k] for d in self.members.values()]
            chosen = super().propose(tokens, k, temperature, generator).tokens
            run = [len(list(itertools.takewhile(lambda x: x[0] == x[1], zip(d, ahead)))) for d in drafts]
            per_step.append((run, len(list(itertools.takewhile(lambda x: x[0] == x[1], zip(chosen, ahead))))))
            return Proposal(chosen)

    oracle = Checked(members, refs, "oracle")
    outs, s = decode_prompts(tiny128, oracle, PROMPTS, k=3, max_tokens=24)
    assert outs == expected
    assert sum(v["accepted_tokens"] for v in oracle.sources.values()) == s["counters"]["num_accepted_tokens"]
    assert sum(v["steps"] for v in oracle.sources.values()) == s["target_steps"] - len(PROMPTS)  # one per round
    assert all(chosen == max(run) for run, chosen in per_step)
    assert any(max(run) > min(run) for run, _ in per_step)  # the members disagreed somewhere: a real choice
    assert s["counters"]["num_accepted_tokens"] > 0


# ---------------------------------------------------------------- speedup formula


def test_speedup_formula_and_k_recommendation():
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 3) == 4.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_speedup(0.8, 3, 0.05) == pytest.approx((1 - 0.8**4) / (0.2 * 1.15))
    assert expected_speedup(0.0, 3, 0.1) < 1.0  # useless drafts only cost
    for k, tau in [(1, 1.5), (3, 2.2), (7, 3.9)]:
        assert expected_tokens_per_step(alpha_from_tau(tau, k), k) == pytest.approx(tau, abs=1e-9)
    with pytest.raises(ValueError):
        alpha_from_tau(5.0, 3)
    # high acceptance and cheap drafts favour long chains; costly drafts short ones
    best_cheap, _ = recommend_k({k: 0.8 for k in range(1, 8)}, c=0.02)
    best_dear, speed = recommend_k({k: 0.8 for k in range(1, 8)}, c=1.0)
    assert best_cheap == 7 and best_dear == 1
    assert speed[1] == pytest.approx(1.8 / 2.0)
    assert recommend_k({1: 0.6, 2: 0.6, 3: None}, 0.1)[0] in (1, 2)


def test_stats_bins_and_summary():
    s = DecodeStats(k=3, bin_size=4)
    s.record_round(1, 3, 2)  # drafts at output positions 1, 2, 3: first two accepted
    s.record_round(4, 3, 0)
    s.record_round(7, 0, 0)  # no draft: not a drafting round
    s.generated_tokens, s.target_steps = 10, 4
    m = s.summary()
    assert m["counters"] == {
        "num_drafts": 2,
        "num_draft_tokens": 6,
        "num_accepted_tokens": 2,
        "num_accepted_tokens_per_pos": [1, 1, 0],
    }
    assert m["mean_acceptance_length"] == 2.0 and m["acceptance_rate"] == pytest.approx(1 / 3)
    assert m["per_position_acceptance"] == [0.5, 0.5, 0.0]
    assert m["acceptance_by_output_position"]["draft_tokens"] == [3, 3]
    assert m["acceptance_by_output_position"]["acceptance_rate"] == [pytest.approx(2 / 3), 0.0]


def test_generation_ends_at_the_first_stop_token(tiny128):
    full = plain_greedy(tiny128.model, PROMPTS[2], 24)
    stop = full[6]
    want = full[: full.index(stop) + 1]
    for drafter in (NoDrafter(), NgramDrafter(1, 3)):
        out = speculative_generate(tiny128, drafter, PROMPTS[2], k=4, max_tokens=24, stop_ids=(stop,))
        assert out == want, drafter.name
