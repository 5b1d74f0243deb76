"""The quickstart's plan: this machine's rates (a probe of seconds), the split of the budget between data, extraction,
training and serving, the training stage's overrides, and the re-plan once the baselines have been served."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

PRESET = "eagle3_smollm2"
# --family: the preset each head family's quickstart trains (the plan, data and clock are the same)
PRESETS = {"eagle3": "eagle3_smollm2", "peagle": "peagle_smollm2", "dflash": "dflash_smollm2", "mlp": "mlp_smollm2"}
DEFAULT_BUDGET = 45.0  # minutes, everything after set-up
PASSES = 3.0  # planned passes over the data: the measured hour ran 2.9 (held-out curve flat at its end)
# rendered tokens per ShareGPT first turn asked, held-out ones included (the shipped pool: 1.13M for 4,000 turns;
# measured 530k for 1,873 on the first budgeted run)
TOKENS_PER_TURN = 283
POOL_TURNS = 4000  # eagle3_smollm2's first turns, the most a budgeted plan asks (the shipped pool answers 8,000)
# rendered tokens per code set of a preset's data.also, for --full's extraction estimate (measured with the tokenizer:
# stdlib 287k greedy and 303k at t=0.7, site-packages:1200 422k; an unknown set counts as a stdlib one)
CODE_SET_TOKENS = {"regen:pycode:stdlib": 295_000, "regen:pycode:site-packages:1200": 422_000}
SITE_PACKAGES_S = 300.0  # --full: reading site-packages for its code prompts (~4 min on 2 cores)
# A budgeted plan's code: CODE_SHARE of its answer tokens are the target's answers to code-completion prompts of the
# stdlib (CODE_SET, shipped with the package: extraction is their only cost), at most the pool's CODE_PROMPTS, and
# never so many that the first turns fall below MIN_TURNS. The preset's code sets lifted HumanEval from 2.03 to 2.50
# tokens per target step at equal minutes with chat and MT-Bench unchanged (2026-11-28, docs/recipe.md); a
# 45-minute head trained on chat alone lost to suffix on HumanEval (1.94 against 2.11, issue 75)
CODE_SHARE = 0.3
CODE_SET = "regen:pycode:stdlib"
CODE_PROMPTS = 1059  # the shipped stdlib pool's prompts (draftsmith/data/regen/pools.json)
CODE_TOKENS_PER_PROMPT = 271  # rendered tokens per stdlib answer (287k for the 1,059, measured with the tokenizer)
# A budgeted plan's long documents: DOC_SHARE of its answer tokens are the target's answers to long-document prompts
# (train/data/doc_tasks.py: ShareGPT's own answers as documents, half summarised, half answered from; DOC_SETS,
# shipped: extraction is their only cost), at most the pools' DOC_PROMPTS, never below MIN_TURNS first turns. They
# are what Spec-Bench's summarization and RAG ask, where a chat and code head lost to suffix (docs/recipe.md)
DOC_SHARE = 0.15
DOC_SETS = ("regen:doctask:summarize", "regen:doctask:qa")
DOC_PROMPTS = 400  # the shipped doctask pools' prompts, 200 each (draftsmith/data/regen/pools.json)
DOC_TOKENS_PER_PROMPT = 576  # rendered tokens per prompt and answer (114k for the first 99 of each, measured)
DOC_READ_S = 10.0  # reading ShareGPT past its first 8,000 records for the documents
CODE_READ_S = 15.0  # reading the stdlib for its prompts (~8 s on 2 cores)
MIN_TURNS = 600  # fewer answers than this trained no head worth serving in the data-size A/Bs
MIN_TRAIN_MINUTES = 5.0
SERVE_SHARE = 0.2  # of the budget, at most, for serving: fewer prompts (not below MIN_PROMPTS) on a slow machine
MIN_PROMPTS = 16
# requests served at once: a budgeted plan serves a multiple of it, because a last, partial batch generates at a
# fraction of a full one's tok/s (26 prompts at 8 a batch served 60 tok/s where 16 had served 80-88, same stand-in)
SERVE_BATCH = 8
MARGIN = 0.05  # share of the budget held back for what the probe cannot see (a busy neighbour, disk)
# what the probe does not time, measured on the first budgeted run (2-core EPYC,
# bench/results/2026-11-28/quickstart_avx512_first/): seconds
DATA_S = 20.0  # read ShareGPT, take the shipped answers, render with the chat template, draft vocab (6 s there)
TRAIN_OVERHEAD_S = 30.0  # start the child, load the target ends, the final held-out eval and checkpoint (12 s there)
EXPORT_S = 15.0
ENGINE_START_S = 20.0  # per method and workload: import vLLM, start an engine (enforce_eager), warm up (~20 s there)
# extraction tok/s over the probe's forward, per features backend, measured on the budgeted runs: the training samples
# (hf 0.95: bench/results/2026-11-28/quickstart_avx512, bf16; vllm 1.21 and 1.11: 2026-11-29/
# quickstart_avx2_emulated_vllm and quickstart_avx2_emulated_zen4, fp32; 1.15 in bf16 from extract_vllm.md's 1.21x
# over hf), the held-out ones, which also take the target's full-vocab argmax per token (hf 0.78; vllm 0.86, 0.85),
# and the seconds before the first sample (loading the target; vllm: starting an engine, 11-24 s there)
EXTRACT_PER_PROBE = {"hf": 0.95, "vllm": 1.15}
HELDOUT_PER_PROBE = {"hf": 0.78, "vllm": 0.85}
EXTRACT_START_S = {"hf": 5.0, "vllm": 30.0}
HELDOUT_SAMPLE_TOKENS = 292  # rendered tokens per held-out sample (37.4-38.1k for 128 on the budgeted runs)
# held-out conversations a budgeted plan sets aside (the preset's 128 stays with --full): they are served as the chat
# prompts and scored for the held-out curve, and are not trained on; 128 were 23 % of the samples and 26 % of the
# extraction of the 45-minute plan at issue 42's AVX2 speeds (bench/results/2026-11-29/quickstart_avx2_slow); 64
# still cover the 16-32 served prompts and bench/quickstart_reserve.sh's 64
HELDOUT = 64
PRESET_HELDOUT = 128
# served tok/s of the training-free methods at batch 8, 128 tokens a prompt, before anything is measured: on the nine
# committed quickstart runs (probes of 253-942 tok/s, AVX2-emulated and throttled ones among them) none, ngram and
# suffix served 56-104 tok/s (median 84) whatever the probe: one engine thread at batch 8 is not bound by the GEMMs'
# speed, where the plan's earlier 0.1 x the probe had counted 787 s of serving for 315 spent at the slow end. The
# baselines are served before training and the training minutes re-planned from what they took (replan_training),
# so a machine that serves slower or faster than this moves the clock, not the budget
SERVE_TOK_S = 80.0
# a head's served tok/s over no speculation's at batch 8: 0.63-0.86 on those runs (median 0.73), 0.59-0.62 in fp32 at
# the slow end (bench/results/2026-12-01/quickstart_avx2_slow_replan: 3.9 min spent where 0.7 had estimated 3.1); the
# low end, since it is the last stage and nothing after it can give the time back
HEAD_SERVE_SPEED = 0.6
WORKLOADS = ("chat", "mtbench", "code")  # held-out chat, MT-Bench, HumanEval (draftsmith.eval.prompts)
SERVE_METHODS = ("none", "ngram", "suffix")
# --hybrid: first turns the policy is fitted on (ShareGPT's, right after the ones trained on; the target answers them
# in vLLM at the served length), and hybrid(head)'s served tok/s over no speculation's at batch 8 (0.87 against the
# head's 0.65 on the 2-core EPYC: suffix's steps cost less than the head's chain, which the policy skips on some)
HYBRID_FIT = 24
HYBRID_FAMILIES = ("eagle3", "mlp")  # the heads draftsmith.serve.hybrid serves
HYBRID_SERVE_SPEED = 0.75
# the fit's seconds before its answers (reading ShareGPT, loading target and head), and per answer position at the
# probe's forward rate FIT_PROBE (the target's forward, suffix's and ngram's proposals at every position, the head's
# chains for all positions in k batched calls), scaled by FIT_PROBE / probe on other machines. bench/fit_record.py on
# a 2-core Xeon (AMX): 4.3 ms a position at a 1,317 tok/s probe, 9.8 ms at 261 (AVX2-capped, slow_machine.sh 100);
# the whole fit 55 s and 115 s (plan: 105 and 173). Drafting one chain per position had cost 3x that recording
# (0.025 s a position at 900 was planned then; bench/results/2026-12-02/fit_record/)
FIT_START_S = 30.0
FIT_S_PER_POSITION = 0.008
FIT_PROBE = 900.0


@dataclass
class Rates:
    forward_tok_s: float
    train_tok_s: float
    bf16: bool
    threads: int
    cpu: str
    flags: str
    # the features backend the training stage will use (training_overrides): vLLM's prefill where it is installed
    backend: str = field(default_factory=lambda: "vllm" if vllm_installed() else "hf")

    @property
    def extract_tok_s(self) -> float:
        return self.forward_tok_s * EXTRACT_PER_PROBE[self.backend]

    def extract_fixed_s(self, heldout: int) -> float:
        """Extraction seconds that do not grow with the data: the start, and `heldout` samples' slower rate."""
        heldout_tok_s = self.forward_tok_s * HELDOUT_PER_PROBE[self.backend]
        tokens = heldout * HELDOUT_SAMPLE_TOKENS
        return EXTRACT_START_S[self.backend] + tokens * (1 / heldout_tok_s - 1 / self.extract_tok_s)

    def extract_s(self, tokens: float, heldout: int) -> float:
        """Seconds to extract the features of `tokens` rendered tokens, `heldout` held-out samples among them."""
        return self.extract_fixed_s(heldout) + tokens / self.extract_tok_s


@dataclass
class Plan:
    budget_min: float | None  # None: --full
    conversations: int
    code_sets: bool  # --full: the preset's code sets as they stand
    train_minutes: float
    num_prompts: int
    workloads: list[str]
    stages: dict[str, float] = field(default_factory=dict)  # planned seconds
    heldout: int = PRESET_HELDOUT  # held-out conversations (plans saved before it was planned kept the preset's)
    # once the baselines are served (before training): {"train_minutes", "serve" (the head's seconds, estimated from
    # the baselines'), "serve_tok_s" (no speculation's, measured)}; kept in plan.json so a re-run trains on one clock
    replanned: dict | None = None
    hybrid: bool = False  # --hybrid: fit the head's hybrid policy and serve hybrid(head) beside it
    code_prompts: int = 0  # a budgeted plan's stdlib code prompts (CODE_SET's first code_prompts)
    doc_prompts: int = 0  # long-document prompts (DOC_SETS' first, half of them each): summarize, answer from a text

    @property
    def clock_minutes(self) -> float:
        """The training stage's optim.max_minutes: the re-planned minutes once the baselines have been served."""
        return self.replanned["train_minutes"] if self.replanned else self.train_minutes

    def also(self) -> list | None:
        """The training stage's data.also: the preset's (None) with --full, else the plan's code set and its
        long-document sets (or none)."""
        if self.code_sets:
            return None
        code = [{"path": CODE_SET, "num_conversations": self.code_prompts}] if self.code_prompts else []
        halves = (self.doc_prompts - self.doc_prompts // 2, self.doc_prompts // 2)
        return code + [{"path": p, "num_conversations": n} for p, n in zip(DOC_SETS, halves) if n]

    def overrides(self, out: Path, extra: list[str], preset: str = PRESET) -> list[str]:
        return training_overrides(
            str(out), self.clock_minutes, self.conversations, self.also(), extra, preset,
            self.heldout,
        )  # fmt: skip


class BudgetTooSmall(ValueError):
    pass


def training_overrides(
    out: str,
    minutes: float,
    conversations: int,
    also: list | None,
    extra: list[str],
    preset: str = PRESET,
    heldout: int = PRESET_HELDOUT,
) -> list[str]:
    """The training stage's Hydra overrides: the preset with its data size, held-out set and clock set (also=None
    keeps its data.also), then the user's own overrides, then resume=auto (a re-run continues)."""
    from draftsmith.train.config import hydra_value

    return [
        f"conf={preset}",
        f"output_dir={out}",
        f"data.num_conversations={conversations}",
        *([] if heldout == PRESET_HELDOUT else [f"data.heldout={heldout}"]),
        *([] if also is None else [f"data.also={hydra_value(also)}"]),
        f"optim.max_minutes={minutes:g}",
        # the features from vLLM's own prefill, where it is installed (the quickstart serves with it): 1.2-1.5x the
        # HF forward's tok/s on 2 cores; equal features (docs/features.md)
        *(["data.features_backend=vllm"] if vllm_installed() else []),
        *extra,
        "resume=auto",
    ]


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def serve_seconds(workloads: list[str], num_prompts: int, max_tokens: int, hybrid: bool = False) -> tuple[float, float]:
    """Planned seconds to serve the training-free methods, and then the head (and its hybrid), on every workload."""
    generate = num_prompts * max_tokens / SERVE_TOK_S
    baselines = len(workloads) * len(SERVE_METHODS) * (ENGINE_START_S + generate)
    head = ENGINE_START_S + generate / HEAD_SERVE_SPEED + (ENGINE_START_S + generate / HYBRID_SERVE_SPEED) * hybrid
    return baselines, len(workloads) * head


def fit_seconds(rates: Rates, max_tokens: int) -> float:
    """Planned seconds of --hybrid's fit: the target answers HYBRID_FIT first turns in vLLM (one engine, one batch),
    then every answer position is recorded (FIT_S_PER_POSITION, scaled by this machine's forward rate)."""
    answers = FIT_START_S + ENGINE_START_S + HYBRID_FIT * max_tokens / SERVE_TOK_S
    return answers + HYBRID_FIT * max_tokens * FIT_S_PER_POSITION * FIT_PROBE / rates.forward_tok_s


def full_data(preset: str) -> tuple[int, float, bool]:
    """--full's data as `preset` stands: its ShareGPT first turns, their rendered tokens with its code sets'
    (estimated, for extraction's ETA), and whether a code set reads site-packages."""
    from draftsmith.train.config import compose_config

    data = compose_config([f"conf={preset}"]).data
    sets = [s if isinstance(s, str) else s.path for s in data.also]
    tokens = data.num_conversations * TOKENS_PER_TURN + sum(CODE_SET_TOKENS.get(s, 295_000) for s in sets)
    return data.num_conversations, tokens, any("site-packages" in s for s in sets)


def make_plan(
    budget_min: float,
    rates: Rates,
    spent_s: float,
    num_prompts: int,
    max_tokens: int,
    full: bool = False,
    hybrid: bool = False,
    preset: str = PRESET,
) -> Plan:
    """Split `budget_min` (minus what is spent already) between extraction, training and serving.

    Each answered turn costs its extraction once and, unless it is held out, PASSES training passes: with e and t the
    extraction and training tok/s, N tokens of which H are held out take N/e + PASSES*(N-H)/t seconds (plus
    extraction's fixed part: its start and the held-out samples' slower rate), so the data grows with the budget and
    the clock follows it. DOC_SHARE of those tokens are long-document answers and CODE_SHARE of the rest stdlib code
    answers (fewer where the first turns would fall below MIN_TURNS, at most their pools'); past the presets' 4,000
    turns the rest goes to code up to its pool's CODE_PROMPTS, then to training minutes. A plan serves chat, MT-Bench
    and HumanEval; a budget too small for that on this machine serves chat and MT-Bench (HumanEval's serving costs ~5
    engine starts and their prompts: 4-5 minutes on the slow AVX2 class). A budgeted plan holds out HELDOUT
    conversations (at least the served prompts); --full the preset's, and its data as it stands (`preset`'s first turns
    and code sets). `hybrid`: the fit and the hybrid's serving come out of the budget too."""
    args = (budget_min, rates, spent_s, num_prompts, max_tokens, full, hybrid, preset)
    try:
        return _plan(*args, WORKLOADS)
    except BudgetTooSmall:  # the smallest budget it names is then the one that serves chat and MT-Bench
        return _plan(*args, WORKLOADS[:2])


def _plan(
    budget_min: float,
    rates: Rates,
    spent_s: float,
    num_prompts: int,
    max_tokens: int,
    full: bool,
    hybrid: bool,
    preset: str,
    workloads: list[str],
) -> Plan:
    """make_plan serving `workloads`."""
    workloads = list(workloads)
    if not full:  # a slow machine serves fewer prompts rather than train less: serving gets at most SERVE_SHARE
        starts = sum(serve_seconds(workloads, 0, max_tokens, hybrid))  # engine starts alone
        per_prompt = sum(serve_seconds(workloads, 1, max_tokens, hybrid)) - starts
        fits = int((budget_min * 60 * SERVE_SHARE - starts) / per_prompt)
        fits -= fits % SERVE_BATCH
        num_prompts = max(min(num_prompts, MIN_PROMPTS), min(num_prompts, fits))
    baselines, serve = serve_seconds(workloads, num_prompts, max_tokens, hybrid)
    fit = {"hybrid": fit_seconds(rates, max_tokens)} if hybrid else {}
    if full:  # the preset as measured: its data (all sets) and its 60 minutes, whatever they take here
        turns, tokens, site_packages = full_data(preset)
        stages = {
            "data": DATA_S + SITE_PACKAGES_S * site_packages,
            "extract": rates.extract_s(tokens, PRESET_HELDOUT),
            "baselines": baselines,
            "train": 3600 + TRAIN_OVERHEAD_S,
            "export": EXPORT_S,
            **fit,
            "serve": serve,
        }
        return Plan(None, turns, True, 60.0, num_prompts, workloads, stages, hybrid=hybrid)
    heldout = max(HELDOUT, num_prompts)
    fixed = (
        DATA_S
        + CODE_READ_S
        + DOC_READ_S * (DOC_SHARE > 0)
        + rates.extract_fixed_s(heldout)
        + baselines
        + TRAIN_OVERHEAD_S
        + EXPORT_S
        + serve
    )
    fixed += sum(fit.values())
    left = budget_min * 60 * (1 - MARGIN) - spent_s - fixed  # seconds for extraction + training
    per_token = 1 / rates.extract_tok_s + PASSES / rates.train_tok_s
    held_train_s = PASSES * heldout * HELDOUT_SAMPLE_TOKENS / rates.train_tok_s  # extracted, never trained on
    tokens = (max(0.0, left) + held_train_s) / per_token  # the answer tokens the budget extracts and trains on
    floor = MIN_TURNS * TOKENS_PER_TURN
    doc_tokens = min(DOC_SHARE * tokens, DOC_PROMPTS * DOC_TOKENS_PER_PROMPT, max(0.0, tokens - floor))
    code_tokens = min(
        CODE_SHARE * (tokens - doc_tokens), CODE_PROMPTS * CODE_TOKENS_PER_PROMPT, max(0.0, tokens - floor - doc_tokens)
    )
    docs = int(doc_tokens / DOC_TOKENS_PER_PROMPT)
    turns = min(POOL_TURNS, int((tokens - code_tokens - docs * DOC_TOKENS_PER_PROMPT) / TOKENS_PER_TURN))
    rest = tokens - turns * TOKENS_PER_TURN - docs * DOC_TOKENS_PER_PROMPT
    code = min(CODE_PROMPTS, int(rest / CODE_TOKENS_PER_PROMPT))
    data_tokens = turns * TOKENS_PER_TURN + code * CODE_TOKENS_PER_PROMPT + docs * DOC_TOKENS_PER_PROMPT
    extract = rates.extract_s(data_tokens, heldout)
    train_min = (left - data_tokens / rates.extract_tok_s) / 60  # `left` has extraction's fixed part off
    if turns < MIN_TURNS or train_min < MIN_TRAIN_MINUTES:
        # the fewest tokens that give both floors: MIN_TURNS first turns, and MIN_TRAIN_MINUTES of training (a budget
        # extracts every token it plans, so the minutes' floor is a token count too: PASSES * N / t - held_train_s)
        least = max(floor, (MIN_TRAIN_MINUTES * 60 + held_train_s) * rates.train_tok_s / PASSES)
        need = spent_s + fixed + least * per_token - held_train_s
        smallest = math.ceil(need / 60 / (1 - MARGIN))
        raise BudgetTooSmall(
            f"--budget {budget_min:g}: too small to train a useful head on this machine (it would answer "
            f"{turns} turns and train {max(train_min, 0):.1f} min; at least {MIN_TURNS} turns and "
            f"{MIN_TRAIN_MINUTES:g} min are needed). The smallest budget that works here: --budget {smallest}"
        )
    train_min = math.floor(train_min * 10) / 10  # tenths of a minute, never past the budget
    stages = {
        "data": DATA_S + CODE_READ_S + DOC_READ_S * (docs > 0),
        "extract": extract,
        "baselines": baselines,
        "train": train_min * 60 + TRAIN_OVERHEAD_S,
        "export": EXPORT_S,
        **fit,
        "serve": serve,
    }
    return Plan(
        budget_min,
        turns,
        False,
        train_min,
        num_prompts,
        workloads,
        stages,
        heldout,
        hybrid=hybrid,
        code_prompts=code,
        doc_prompts=docs,
    )


def replan_training(plan: Plan, results: dict[str, dict], baselines_s: float, elapsed_s: float) -> dict:
    """Once the baselines are served (`results`: run_acceptance's per workload, `baselines_s` the stage's wall time,
    `elapsed_s` the run's so far): the training minutes that fill what is left of the budget, with the head's serving
    estimated from this machine's own: per workload an engine's start as the baselines' took (process time less
    generation), no speculation's generation over HEAD_SERVE_SPEED (and, with --hybrid, another start and its generation
    over HYBRID_SERVE_SPEED, the fit as planned), and the stage's own overhead again. --full keeps
    the preset's 60 minutes; a baseline that failed keeps the plan's minutes."""
    rows = {(w, m): r["methods"].get(m, {}) for w, r in results.items() for m in SERVE_METHODS}
    if plan.budget_min is None or any(r.get("status") != "ok" for r in rows.values()):
        return {"train_minutes": plan.train_minutes, "serve": plan.stages["serve"], "serve_tok_s": None}
    head = baselines_s - sum(r["process_s"] for r in rows.values())  # tokenizer, prompts, reports: once more
    for w in results:
        starts = [rows[w, m]["process_s"] - rows[w, m]["generation_s"] for m in SERVE_METHODS]
        start, gen = sum(starts) / len(starts), rows[w, "none"]["generation_s"]
        head += start + gen / HEAD_SERVE_SPEED + (start + gen / HYBRID_SERVE_SPEED) * plan.hybrid
    fit = plan.stages.get("hybrid", 0.0)
    left = plan.budget_min * 60 * (1 - MARGIN) - elapsed_s - TRAIN_OVERHEAD_S - EXPORT_S - fit - head
    minutes = max(MIN_TRAIN_MINUTES, math.floor(left / 60 * 10) / 10)  # past the budget rather than no head
    none = [rows[w, "none"] for w in results]
    tok_s = sum(r["generated_tokens"] for r in none) / sum(r["generation_s"] for r in none)
    return {"train_minutes": minutes, "serve": round(head, 1), "serve_tok_s": round(tok_s, 1)}


def probe(target_dir: str, preset: str = PRESET) -> Rates:
    """Time the target's feature forward and the preset head's training step here (~30 s)."""
    import torch
    from transformers import AutoConfig

    from draftsmith.probe import cpu_flags, cpu_name, head_step_rate, target_forward_rate
    from draftsmith.train.build import probe_fast_bf16, target_dtype
    from draftsmith.train.config import compose_config
    from draftsmith.train.target import Target

    cfg = compose_config([f"conf={preset}"])
    cpu = torch.device("cpu")
    bf16 = probe_fast_bf16(cpu)
    target = Target.from_pretrained(target_dir, dtype=target_dtype("auto", cpu))
    forward = target_forward_rate(target, seq=512)
    del target
    tc = AutoConfig.from_pretrained(target_dir)
    mlp = cfg.head.family == "mlp_speculator"
    train = head_step_rate(
        tc,
        cfg.data.max_tokens_per_batch,
        (cfg.head.draft_vocab_size or tc.vocab_size) if mlp else cfg.head.draft_vocab_size,
        cfg.head.n_predict if mlp else cfg.head.block_size - 1 if cfg.head.family == "dflash" else cfg.head.ttt_steps,
        cfg.optim.name,
        "bf16" if bf16 else "fp32",
        family=cfg.head.family,
        tie_weights=mlp and cfg.head.tie_weights,
    )
    return Rates(forward, train, bf16, torch.get_num_threads(), cpu_name(), cpu_flags())


def load_or_plan(out: Path, key: dict, make) -> Plan:
    """The plan saved by an earlier run of the same command (so a re-run resumes the same training run), else a new
    one, saved."""
    path = out / "plan.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            print(f"plan: reusing {path} (the same command ran before; training resumes from its checkpoint)")
            return Plan(**saved["plan"])
    plan = make()
    save_plan(out, key, plan)
    return plan


def save_plan(out: Path, key: dict, plan: Plan) -> None:
    from draftsmith.atomic import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "plan.json", {"key": key, "plan": asdict(plan)})


def stage_replans(plan: Plan) -> dict[str, float]:
    """The stages the re-plan after the baselines changed, in seconds (train: its clock plus the child's overhead)."""
    r = plan.replanned
    if not r or plan.budget_min is None:
        return {}
    return {"train": r["train_minutes"] * 60 + TRAIN_OVERHEAD_S, "serve": r["serve"]}
