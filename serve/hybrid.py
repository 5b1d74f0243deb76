"""Serve the hybrid drafter in vLLM V1: the head (an EAGLE-3 head in vLLM's own drafter, or an MLP speculator in
draftsmith's plugin), suffix decoding and prompt lookup, one of them chosen per request and step by the policy fitted
next to the head (`draftsmith eval fit-hybrid`).

    from vllm import LLM
    from draftsmith.serve.hybrid import hybrid_kwargs
    llm = LLM(model=TARGET, **hybrid_kwargs("exported/eagle3_smollm2", k=3), disable_log_stats=False)
    # = speculative_config={"method": "eagle3", "model": DIR, "num_speculative_tokens": 3,
    #                       "disable_padded_drafter_batch": True},
    #   additional_config={"draftsmith_hybrid": {"policy": DIR, ...}}
    # an exported MLP speculator: speculative_config={"method": "custom_class", "model":
    #   "draftsmith.serve.plugin.MLPSpeculatorProposer", ...}, additional_config={"mlp_speculator": DIR, ...} beside it

How. The general plugin (`draftsmith.serve.plugin:register`, run by vLLM in every engine process) wraps the model
runner's `propose_draft_token_ids`. Without `additional_config["draftsmith_hybrid"]` the wrapper calls vLLM's
method and returns (nothing else changes). With it, each step the wrapper

* asks vLLM's suffix decoding proposer (arctic-inference, same settings as `method="suffix"`) for its drafts,
  recording each draft's score, and prompt lookup (`ngram_match`, vLLM's rule) for its;
* lets vLLM's EAGLE-3 proposer draft its chain for every request (its own KV state, the target's aux states:
  all vLLM's), reading the head's probability of each token it drafted (a hook on the draft model's
  `compute_logits`), whose chain score (Σ of running products) is the head's signal, as in the reference
  decoder. When no request's training-free drafts leave the head a chance (the policy's best head bin does not
  beat them), the chain is not run: vLLM's dynamic draft length is set to 0 for the step, so the drafter only
  runs its first pass, which keeps the head's KV cache in step with the target's. The choice is the same as
  if the head had drafted; only its cost is saved;
* an MLP speculator (`draftsmith.serve.plugin.MLPSpeculatorProposer`) reports its picks' probabilities itself, and
  a skipped chain runs no stage at all (it keeps no state between steps);
* keeps per request the draft its policy expects to be accepted furthest (hybrid.json may hold one policy per
  temperature; a request uses the one fitted nearest its own, greedy = 0).

The drafts then go back as per-request lists of varying length, as ngram and suffix return them; rejection,
the bonus token and vLLM's spec-decode counters are untouched. `force` ("head", "suffix", "ngram") pins the
choice, "full" never skips the head's chain (contract tests). Per-source figures (steps given, tokens
drafted, tokens accepted: read from how many tokens the request advanced on its next step), the seconds spent
in each drafting part and the steps whose head chain was skipped are written to `stats` (a JSON file) when one
is named.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from draftsmith.errors import ConfigError
from draftsmith.serve.runner import HYBRID_KEY as KEY  # additional_config[KEY] names a hybrid

MLP_PROPOSER = "draftsmith.serve.plugin.MLPSpeculatorProposer"  # vllm_plugin.CLASS_PATH


def hybrid_kwargs(head_dir: str | os.PathLike, k: int = 3, force: str | None = None, stats: str | None = None) -> dict:
    """LLM(...) keyword arguments serving the exported head at head_dir (EAGLE-3 or MLP speculator) as a hybrid with
    its fitted policy."""
    import json

    from draftsmith.serve.policy import HybridPolicies

    head_dir = str(Path(head_dir).resolve())
    # refused here, before any engine starts, as the engine would refuse it: no policy, a malformed one, one fitted
    # for other head weights
    check_policy(HybridPolicies.load(head_dir), head_dir)
    if force not in (None, "head", "suffix", "ngram", "full"):
        raise ValueError(f"force={force!r}: head, suffix, ngram, full or None")
    # "full": the policy chooses, but the head's chain runs every step (never skipped; the skip's contract test)
    settings = {"policy": head_dir, "force": None if force == "full" else force, "skip_head": force != "full"}
    extra = {KEY: {**settings, "stats": stats}}
    if json.loads((Path(head_dir) / "config.json").read_text()).get("model_type") == "mlp_speculator":
        # the plugin's proposer (vllm_plugin.speculative_kwargs; named here, since the plugin imports this module to
        # install the hybrid): it drafts after vLLM's bookkeeping, as suffix and prompt lookup do
        spec = {"method": "custom_class", "model": MLP_PROPOSER, "num_speculative_tokens": k}
        return {"speculative_config": spec, "additional_config": {"mlp_speculator": head_dir, **extra}}
    return {
        # unpadded drafter batch: vLLM then drafts after its bookkeeping, so every request's token row already holds
        # this step's tokens when suffix and prompt lookup read it (the padded EAGLE path drafts before)
        "speculative_config": {
            "method": "eagle3",
            "model": head_dir,
            "num_speculative_tokens": k,
            "disable_padded_drafter_batch": True,
        },
        "additional_config": extra,
    }


FIELDS = ("steps", "draft_tokens", "accepted_tokens")  # per source, in the stats file and on /metrics
_COUNTERS: dict = {}


def prometheus_counters() -> dict:
    """The hybrid's counters on vLLM's /metrics, made once per process: `draftsmith:hybrid_{steps,draft_tokens,
    accepted_tokens}_total{source=head|ngram|suffix}` and `draftsmith:hybrid_head_skipped_steps_total`. The engine
    runs in its own process behind a server: its counters reach the server's /metrics when PROMETHEUS_MULTIPROC_DIR
    names a directory shared by both (draftsmith serve sets one); in-process (LLM with multiprocessing off) they
    are in the process's own registry."""
    if not _COUNTERS:
        from prometheus_client import Counter

        docs = {
            "steps": "Request-steps the hybrid drafter gave to this source's draft",
            "draft_tokens": "Draft tokens the hybrid drafter proposed from this source",
            "accepted_tokens": "Draft tokens from this source that verification accepted",
        }
        for name in FIELDS:
            _COUNTERS[name] = Counter(f"draftsmith:hybrid_{name}", docs[name], ["source"])
        _COUNTERS["head_skipped"] = Counter(
            "draftsmith:hybrid_head_skipped_steps",
            "Engine steps on which no head draft could win: its chain did not run",
        )
    return _COUNTERS


class _Hybrid:
    """The per-engine state: the policy, the suffix proposer, the head's captured probabilities, the counters."""

    def __init__(self, runner, settings: dict):
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        from draftsmith.serve.policy import HybridPolicies

        self.policies = HybridPolicies.load(settings["policy"])
        check_policy(self.policies, settings["policy"])
        mismatch = k_mismatch(
            self.policies, settings["policy"], runner.vllm_config.speculative_config.num_speculative_tokens
        )
        if mismatch:
            print(f"draftsmith hybrid: warning: {mismatch}", flush=True)
        self.force = settings.get("force")
        self.skip_head = settings.get("skip_head", True)
        self.stats_path = settings.get("stats")
        cfg = runner.vllm_config.speculative_config
        self.mlp = cfg.method == "custom_class"  # the MLP speculator in draftsmith's plugin (hybrid_kwargs)
        self.k = cfg.num_speculative_tokens
        self.depth = min(self.k, self.policies.depth)  # the head's passes when its chain runs (the deepest policy)
        self.ngram = (cfg.prompt_lookup_min or 2, cfg.prompt_lookup_max or 5)
        self.suffix = SuffixDecodingProposer(runner.vllm_config) if "suffix" in self.policies.members else None
        self.scores: dict[str, float] = {}
        if self.suffix is not None:
            speculate = getattr(getattr(self.suffix, "suffix_cache", None), "speculate", None)
            if speculate is None:
                from draftsmith.serve.compat import VllmCompatError

                raise VllmCompatError(
                    "vLLM's SuffixDecodingProposer has no suffix_cache.speculate, which the hybrid reads its scores "
                    "from; this vLLM is not one draftsmith supports"
                )

            def scored(req_id, *a, **kw):
                draft = speculate(req_id, *a, **kw)
                self.scores[req_id] = draft.score
                return draft

            self.suffix.suffix_cache.speculate = scored
        self.head_probs: list = []  # per chain step: [num_reqs] probability of the drafted token
        self.hooked = False
        self.pending: dict[str, tuple[str, int]] = {}  # req_id -> (role, draft length) being verified
        self.sources = {r: {"steps": 0, "draft_tokens": 0, "accepted_tokens": 0} for r in self.policies.members}
        self.seconds = {"head": 0.0, "suffix": 0.0, "ngram": 0.0, "choose": 0.0}  # wall time of each drafting part
        self.skipped = 0  # steps on which no request's head draft could have been chosen: its chain did not run
        self.metrics = prometheus_counters()
        for role in self.policies.members:  # every source shows on /metrics from the start, at 0
            for name in FIELDS:
                self.metrics[name].labels(source=role).inc(0)

    def count(self, role: str, name: str, n: int) -> None:
        """Add n to a source's figure: the stats file's and the Prometheus counter's (/metrics)."""
        self.sources[role][name] += n
        self.metrics[name].labels(source=role).inc(n)

    def hook(self, drafter) -> None:
        """Capture the head's probability of each token its greedy chain drafts (softmax max of its logits)."""
        import torch

        if self.mlp:  # the plugin's proposer keeps them itself (run_head reads them)
            drafter.keep_probs = True
            self.hooked = True
            return
        if getattr(drafter, "_enable_probabilistic_draft_probs", False):
            # the runner would then verify suffix/ngram drafts against the head's draft probabilities
            raise ValueError("the hybrid drafter needs vLLM's greedy EAGLE drafting (draft_sample_method='greedy')")
        model = drafter.model
        compute_logits = model.compute_logits

        def capture(*a, **kw):
            logits = compute_logits(*a, **kw)
            self.head_probs.append(torch.softmax(logits.float(), dim=-1).amax(dim=-1).tolist())
            return logits

        model.compute_logits = capture
        self.hooked = True

    def policy(self, batch, i: int):
        """The policy for request row i: the one fitted nearest its temperature (vLLM stores 0 for greedy)."""
        return self.policies.for_temperature(float(batch.temperature_cpu[i]))

    def free_drafts(self, runner, sampled_token_ids) -> list[dict | None]:
        """Before the head runs: per request its suffix and prompt-lookup drafts (None for a partial prefill,
        which drafts nothing); and the accounting of the drafts just verified."""
        from draftsmith.serve.ngram import ngram_match
        from draftsmith.serve.policy import Proposal

        t0 = time.perf_counter()
        batch = runner.input_batch
        sampled = sampled_token_ids if isinstance(sampled_token_ids, list) else None
        if sampled is None:  # a padded-batch tensor: rejected slots are -1
            sampled = [[t for t in row if t >= 0] for row in sampled_token_ids.tolist()]
        suffix = self.suffix.propose(self.k, batch, sampled) if self.suffix is not None else None
        t1 = time.perf_counter()
        self.seconds["suffix"] += t1 - t0
        free: list[dict | None] = []
        for i, req_id in enumerate(batch.req_ids[: len(sampled)]):
            done = self.pending.pop(req_id, None)
            if done is not None and sampled[i]:  # the tokens this request committed: accepted drafts + one
                self.count(done[0], "accepted_tokens", min(len(sampled[i]) - 1, done[1]))
            if not sampled[i]:
                free.append(None)
                continue
            props = {}
            if "ngram" in self.policies.members:
                tokens = batch.token_ids_cpu[i, : int(batch.num_tokens_no_spec[i])].tolist()
                draft, n = ngram_match(tokens, self.k, *self.ngram)
                props["ngram"] = Proposal(draft, signal=float(n))
            if suffix is not None:
                props["suffix"] = Proposal(list(suffix[i]), signal=self.scores.get(req_id, 0.0))
            free.append(props)
        for req_id in set(self.pending) - set(batch.req_ids):  # finished requests
            self.pending.pop(req_id)
        self.seconds["ngram"] += time.perf_counter() - t1
        return free

    def head_needed(self, batch, free: list[dict | None]) -> bool:
        """Whether the head's chain must run this step: forced to the head, or some request's training-free
        drafts leave the head a chance under its policy (the choice is then the same as if the head had
        drafted)."""
        if self.force is not None:
            return self.force == "head"
        return not self.skip_head or any(
            props is not None and (pol := self.policy(batch, i)).head_can_win(_of(pol, props))
            for i, props in enumerate(free)
        )

    def run_head(self, runner, scheduler_output, steps: int, draft):
        """The head's chain for this step, `steps` long (0: skipped): `draft()` is vLLM's own drafting call."""
        if self.mlp:
            runner.drafter.steps = steps
            try:
                drafts = draft()
            finally:
                runner.drafter.steps = None
            self.head_probs = runner.drafter.last_probs
            return drafts
        depth = scheduler_output.num_spec_tokens_to_schedule
        # vLLM's dynamic-draft-length path: at 0 the drafter's first pass still runs (the head's KV cache stays in
        # step with the target's), but it drafts nothing; below k the chain stops after the policy's depth
        scheduler_output.num_spec_tokens_to_schedule = min(steps, depth)
        try:
            return draft()
        finally:
            scheduler_output.num_spec_tokens_to_schedule = depth

    def choose(self, runner, head_drafts, free: list[dict | None]) -> list[list[int]]:
        from draftsmith.serve.policy import Proposal, chain_score

        t0 = time.perf_counter()
        batch = runner.input_batch
        heads = head_drafts.tolist() if hasattr(head_drafts, "tolist") else [list(d) for d in head_drafts]
        out = []
        for i, props in enumerate(free):
            if props is None:  # a partial prefill: nothing to draft from
                out.append([])
                continue
            policy = self.policy(batch, i)
            depth = min(self.depth, policy.depth)  # this request's policy was calibrated on that many head tokens
            probs = [p[i] for p in self.head_probs[:depth] if i < len(p)]
            head = heads[i][:depth] if i < len(heads) else []
            props = {"head": Proposal(head, signal=chain_score(probs)), **props}
            role = self.force or policy.choose(_of(policy, props))
            draft = props[role].tokens
            self.count(role, "steps", 1)
            self.count(role, "draft_tokens", len(draft))
            self.pending[batch.req_ids[i]] = (role, len(draft))
            out.append(list(draft))
        self.seconds["choose"] += time.perf_counter() - t0
        self.write_stats()
        return out

    def write_stats(self) -> None:
        """Rewritten every step (the runner reads it around its timed generation): atomic, but not fsynced, which
        would cost ~1 ms a step on this hot path."""
        if self.stats_path:
            from draftsmith.atomic import atomic_write_json

            stats = {"force": self.force, "sources": self.sources, "seconds": self.seconds}
            atomic_write_json(self.stats_path, {**stats, "head_skipped": self.skipped}, durable=False)


def _of(policy, props: dict) -> dict:
    """The drafts of the members this policy calibrates (policies at other temperatures may name others)."""
    return {r: p for r, p in props.items() if r in policy.members}


def check_policy(policies, head_dir: str) -> None:
    """Refuse a policy fitted for other head weights (hybrid.json records the digest of the head it was fitted on):
    at engine start, so a server never serves it, and in hybrid_kwargs, before any engine starts."""
    from draftsmith.train.checkpoint import head_digest_of

    digest = head_digest_of(head_dir)
    other = [p for p in policies.policies if p.fitted_on.get("head") != digest]
    if other:
        raise ConfigError(
            f"{Path(head_dir) / 'hybrid.json'}: the policy for temperature {other[0].temperature:g} was fitted for "
            f"another head (its recorded digest {other[0].fitted_on.get('head') or 'none'} is not this head's "
            f"{digest}: re-exported or retrained weights, or a file copied from elsewhere). Refit it: draftsmith "
            f"eval fit-hybrid --head {head_dir} --target TARGET"
        )


def k_mismatch(policies, head_dir: str, k: int) -> str | None:
    """Why serving this policy at k is not what was fitted (None when k is its k): `draftsmith serve` refuses it, an
    engine started with it says so in its log (eval matrix serves a policy across k on purpose)."""
    if policies.k == k:
        return None
    return (
        f"{Path(head_dir) / 'hybrid.json'} was fitted at k={policies.k}, but k={k} is asked (num_speculative_tokens): "
        f"its calibration counts accepted tokens of {policies.k}-token drafts. Serve it at k={policies.k}, or refit "
        f"for k={k}: draftsmith eval fit-hybrid --head {head_dir} --k {k} --target TARGET"
    )


def _build(runner) -> _Hybrid | None:
    """The runner's hybrid drafter, built once (at load, so a missing or mismatched policy fails the engine's start
    before the server answers /health); None when additional_config names no hybrid."""
    extra = runner.vllm_config.additional_config
    settings = extra.get(KEY) if isinstance(extra, dict) else None
    if not settings:
        return None
    hybrid = getattr(runner, "_draftsmith_hybrid_state", None)
    if hybrid is None:
        hybrid = runner._draftsmith_hybrid_state = _Hybrid(runner, settings)
    if not hybrid.hooked:
        hybrid.hook(runner.drafter)
    return hybrid


def _wrap_load_model(cls) -> None:
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, "_draftsmith_hybrid", False):
        return

    def load_model(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        _build(self)
        return out

    load_model._draftsmith_hybrid = True
    cls.load_model = load_model


def install() -> None:
    """Wrap vLLM's model runner so that a hybrid named in additional_config takes over the draft choice (built when
    the runner loads its model, so a bad policy stops the engine's start). Each wrapped internal is looked up first:
    a vLLM that renamed one is refused by name (serve/compat.py), not served without the hybrid."""
    from draftsmith.serve.compat import internal

    GPUModelRunner = internal("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    internal("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids")
    internal("vllm.v1.core.sched.output", "SchedulerOutput", "num_spec_tokens_to_schedule")
    _wrap_load_model(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner  # its own load_model (a CPU build)
    except ImportError:
        CPUModelRunner = None
    if CPUModelRunner is not None:
        _wrap_load_model(CPUModelRunner)
    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, "_draftsmith_hybrid", False):
        return

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        hybrid = _build(self)
        if hybrid is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        hybrid.head_probs.clear()  # this step's captures only (the runner's dummy runs also compute logits)
        hybrid.scores.clear()
        free = hybrid.free_drafts(self, sampled_token_ids)
        steps = hybrid.depth
        if not hybrid.head_needed(self.input_batch, free):
            hybrid.skipped += 1
            hybrid.metrics["head_skipped"].inc()
            steps = 0
        t = time.perf_counter()
        drafts = hybrid.run_head(
            self, scheduler_output, steps, lambda: original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        )
        hybrid.seconds["head"] += time.perf_counter() - t
        return hybrid.choose(self, drafts, free)

    propose_draft_token_ids._draftsmith_hybrid = True
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
