"""`draftsmith quickstart`: a first EAGLE-3 head for the embedded default, end to end, within a time budget.

    draftsmith quickstart                  # 45 minutes after set-up, planned from a probe of this machine
    draftsmith quickstart --budget 90      # more data and training minutes
    draftsmith quickstart --full           # the preset as measured: its data (turns + code sets), 60 training minutes
    draftsmith quickstart --family peagle  # a parallel-drafting (P-EAGLE) head instead: same plan, data and clock
    draftsmith quickstart --family dflash  # a DFlash block drafter (one non-causal forward drafts the block)
    draftsmith quickstart --family mlp     # an MLP speculator (IBM), served through draftsmith's vLLM plugin
    draftsmith quickstart --no-hybrid      # the head alone: no hybrid fitted or served, its minutes go to training

Stages: prepare the target (SmolLM2-135M-Instruct GGUF -> HF dir, once) -> probe this machine (target forward,
head training step: seconds) -> plan -> the target's own answers to ShareGPT first turns (shipped with the package
for this target; regenerated where anything differs) and their features (extracted once, cached) -> ngram, suffix
and no speculation served in real vLLM on held-out chat prompts and MT-Bench (and HumanEval with --full), before
training: what they take here re-plans the training minutes to fill the rest of the budget -> train the head
(train/run.py conf=eagle3_smollm2, the re-planned minutes on the clock) -> export for vLLM -> the head served on the
same prompts, beside the baselines' results; for an EAGLE-3 head or an MLP speculator (not with --no-hybrid), first
the head's hybrid policy is fitted on first turns it never trained on, and hybrid(HEAD) (per step the head's draft,
suffix's or ngram's) is served beside it. The plan with an ETA per stage prints before anything
runs; the last lines compare planned (and re-planned) with spent time per stage. Everything lands in
<out>/quickstart.json. Re-running the same command continues from the last checkpoint (the plan in <out>/plan.json is
reused, its re-planned clock with it, and the baselines already served are not served again).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.argtypes import positive_float, positive_int

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
    code_sets: bool
    train_minutes: float
    num_prompts: int
    workloads: list[str]
    stages: dict[str, float] = field(default_factory=dict)  # planned seconds
    heldout: int = PRESET_HELDOUT  # held-out conversations (plans saved before it was planned kept the preset's)
    # once the baselines are served (before training): {"train_minutes", "serve" (the head's seconds, estimated from
    # the baselines'), "serve_tok_s" (no speculation's, measured)}; kept in plan.json so a re-run trains on one clock
    replanned: dict | None = None
    hybrid: bool = False  # --hybrid: fit the head's hybrid policy and serve hybrid(head) beside it

    @property
    def clock_minutes(self) -> float:
        """The training stage's optim.max_minutes: the re-planned minutes once the baselines have been served."""
        return self.replanned["train_minutes"] if self.replanned else self.train_minutes

    def overrides(self, out: Path, extra: list[str], preset: str = PRESET) -> list[str]:
        return training_overrides(
            str(out), self.clock_minutes, self.conversations, None if self.code_sets else [], extra, preset,
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
    return [
        f"conf={preset}",
        f"output_dir={out}",
        f"data.num_conversations={conversations}",
        *([] if heldout == PRESET_HELDOUT else [f"data.heldout={heldout}"]),
        *([] if also is None else ["data.also=[]"]),
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
    the clock follows it; past the presets' 4,000 turns the rest goes to training minutes. A budgeted plan holds
    out HELDOUT conversations (at least the served prompts); --full the preset's, and its data as it stands (`preset`'s
    first turns and code sets). `hybrid`: the fit and the hybrid's serving come out of the budget too."""
    workloads = ["chat", "mtbench"] + (["code"] if full else [])
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
    fixed = DATA_S + rates.extract_fixed_s(heldout) + baselines + TRAIN_OVERHEAD_S + EXPORT_S + serve
    fixed += sum(fit.values())
    left = budget_min * 60 * (1 - MARGIN) - spent_s - fixed  # seconds for extraction + training
    per_token = 1 / rates.extract_tok_s + PASSES / rates.train_tok_s
    held_train_s = PASSES * heldout * HELDOUT_SAMPLE_TOKENS / rates.train_tok_s  # extracted, never trained on
    turns = int((max(0.0, left) + held_train_s) / per_token / TOKENS_PER_TURN)
    turns = min(POOL_TURNS, turns)
    extract = rates.extract_s(turns * TOKENS_PER_TURN, heldout)
    train_min = (left - turns * TOKENS_PER_TURN / rates.extract_tok_s) / 60  # `left` has extraction's fixed part off
    if turns < MIN_TURNS or train_min < MIN_TRAIN_MINUTES:
        need = (
            spent_s
            + fixed
            + max(
                MIN_TURNS * TOKENS_PER_TURN * per_token - held_train_s,
                MIN_TURNS * TOKENS_PER_TURN / rates.extract_tok_s + MIN_TRAIN_MINUTES * 60,
            )
        )
        smallest = math.ceil(need / 60 / (1 - MARGIN))
        raise BudgetTooSmall(
            f"--budget {budget_min:g}: too small to train a useful head on this machine (it would answer "
            f"{turns} turns and train {max(train_min, 0):.1f} min; at least {MIN_TURNS} turns and "
            f"{MIN_TRAIN_MINUTES:g} min are needed). The smallest budget that works here: --budget {smallest}"
        )
    train_min = math.floor(train_min * 10) / 10  # tenths of a minute, never past the budget
    stages = {
        "data": DATA_S,
        "extract": extract,
        "baselines": baselines,
        "train": train_min * 60 + TRAIN_OVERHEAD_S,
        "export": EXPORT_S,
        **fit,
        "serve": serve,
    }
    return Plan(budget_min, turns, False, train_min, num_prompts, workloads, stages, heldout, hybrid=hybrid)


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


def fmt_min(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def machine_line(rates: Rates) -> str:
    return (
        f"machine: {rates.cpu} ({rates.flags}), {rates.threads} torch threads, bf16 {'on' if rates.bf16 else 'off'}; "
        f"target forward {rates.forward_tok_s:.0f} tok/s, head step {rates.train_tok_s:.0f} tok/s"
    )


def print_plan(plan: Plan, rates: Rates, spent: dict[str, float]) -> None:
    print(machine_line(rates), flush=True)
    data = f"the target's answers to {plan.conversations:,} ShareGPT first turns ({plan.heldout} held out)" + (
        " + the preset's code sets" if plan.code_sets else ""
    )
    print(
        f"plan ({'--full: the preset as measured' if plan.budget_min is None else f'budget {plan.budget_min:g} min'}):"
        f" {data}; {plan.train_minutes:g} training minutes (~{PASSES:g} passes); served on "
        f"{', '.join(plan.workloads)} x {plan.num_prompts} prompts"
        + ("; the head's hybrid fitted and served beside it" if plan.hybrid else ""),
        flush=True,
    )
    clock = sum(spent.values())
    for name, seconds in plan.stages.items():
        clock += seconds
        print(f"  {name:<9} {fmt_min(seconds):>9}   ETA +{fmt_min(clock)}", flush=True)


@dataclass
class Stages:
    """Wall time per stage, printed as a banner around each."""

    spent: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, title: str, fn):
        print(f"\n=== {title} ===", flush=True)
        start = time.time()
        try:
            return fn()
        finally:
            self.spent[name] = round(time.time() - start, 1)
            print(f"=== {name}: {fmt_min(self.spent[name])} ===", flush=True)


def run_child(cmd: list[str]) -> int:
    """Run `cmd` and return its exit status, leaving Ctrl-C to it.

    The terminal sends Ctrl-C to both processes. Training answers it by finishing its step and saving a checkpoint,
    but subprocess.run would kill it 0.25 s after our own KeyboardInterrupt. So this process ignores SIGINT while it
    waits, and the child gets the default handler back before it starts (an ignored SIGINT is inherited).
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.run(cmd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)).returncode
    finally:
        signal.signal(signal.SIGINT, previous)


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


def served_rows(results: dict[str, dict]) -> list[dict]:
    """Per workload and method: tokens per target step, served tok/s and the speed-up against no speculation."""
    rows = []
    for workload, result in results.items():
        none = result["methods"].get("none", {})
        for name, r in result["methods"].items():
            if r.get("status") != "ok":
                rows.append({"workload": workload, "method": name, "status": r.get("status"), "error": r.get("error")})
                continue
            rows.append(
                {
                    "workload": workload,
                    "method": name,
                    "tokens_per_target_step": r["tokens_per_target_step"],
                    "per_position_acceptance": r["per_position_acceptance"],
                    "output_tok_s": r["output_tokens_per_s"],
                    "speedup_vs_none": (
                        r["output_tokens_per_s"] / none["output_tokens_per_s"]
                        if none.get("output_tokens_per_s")
                        else None
                    ),
                    "match_vs_none": r.get("match_vs_none"),
                }
            )
    return rows


def headline(rows: list[dict], rates: Rates, head: str = "eagle3") -> str:
    """The README's headline table: per workload, the head's tokens per target step against ngram and suffix, and
    its served speed against no speculation; with --hybrid, hybrid(head)'s beside them."""
    by = {(r["workload"], r["method"]): r for r in rows if "tokens_per_target_step" in r}
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    hybrid = f"hybrid({head})"
    with_hybrid = any(r["method"] == hybrid for r in rows)
    extra = " hybrid tok/step | hybrid / best training-free | hybrid tok/s vs none |" if with_hybrid else ""
    out = [
        f"machine: {rates.cpu} ({rates.flags}), 2 cores; served in vLLM at batch 8, greedy, k=3, 128 tokens",
        "",
        "| workload | head tok/step | ngram | suffix | head / best training-free | head tok/s vs none "
        "| outputs = none |" + extra,
        "|---|---|---|---|---|---|---|" + "---|" * (3 if with_hybrid else 0),
    ]
    for w in workloads:
        h, n, s = by.get((w, head)), by.get((w, "ngram")), by.get((w, "suffix"))
        if not (h and n and s):
            pad = " |" * (3 if with_hybrid else 0)  # the hybrid's columns
            out.append(f"| {w} | failed: see acceptance/{w}/acceptance.md | | | | | |" + pad)
            continue
        best = max(n["tokens_per_target_step"], s["tokens_per_target_step"])
        matches = [h["match_vs_none"]]
        cells = ""
        if with_hybrid:
            y = by.get((w, hybrid))
            if y:
                matches.append(y["match_vs_none"])
                cells = (
                    f" **{y['tokens_per_target_step']:.2f}** | {y['tokens_per_target_step'] / best:.2f}x | "
                    f"{y['speedup_vs_none']:.2f}x |"
                )
            else:
                cells = " failed | | |"
        out.append(
            f"| {w} | **{h['tokens_per_target_step']:.2f}** | {n['tokens_per_target_step']:.2f} | "
            f"{s['tokens_per_target_step']:.2f} | {h['tokens_per_target_step'] / best:.2f}x | "
            f"{h['speedup_vs_none']:.2f}x | {min(matches):.2f} |" + cells
        )
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with --hybrid resolved to True or False (its default follows --family)."""
    p = argparse.ArgumentParser(
        prog="draftsmith quickstart", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="outputs/quickstart", help="run directory (default: outputs/quickstart)")
    p.add_argument(
        "--budget",
        type=positive_float,
        default=DEFAULT_BUDGET,
        help=f"minutes for everything after set-up (default {DEFAULT_BUDGET:g}); the plan fits data, training and "
        "serving into it from a probe of this machine",
    )
    p.add_argument("--full", action="store_true", help="the preset as measured (4,000 turns + code sets, 60 min)")
    p.add_argument("--plan-only", action="store_true", help="probe this machine, print the plan and stop")
    p.add_argument(
        "--family",
        choices=sorted(PRESETS),
        default="eagle3",
        help="the head: eagle3 (default, drafts step by step), peagle (all k drafts in one forward), dflash (a block "
        "drafter: the block in one non-causal forward over the target's states) or mlp (the MLP speculator: no "
        "attention, no KV cache); "
        f"presets {', '.join(f'{k}: {v}' for k, v in PRESETS.items())}",
    )
    p.add_argument(
        "--hybrid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"fit the head's hybrid policy (the head, suffix and ngram chosen per step; eval fit-hybrid on "
        f"{HYBRID_FIT} ShareGPT first turns it never trained on) and serve hybrid(HEAD) beside the head; its fit and "
        f"serving come out of the budget. On by default for --family {' and '.join(HYBRID_FAMILIES)} (the only "
        "configuration that beat the best training-free method on every machine class measured, the slow AVX2 one "
        "included); --no-hybrid serves the head alone and gives the fit's minutes to training",
    )
    p.add_argument(
        "--num-prompts", type=positive_int, default=32, help="prompts served per workload and method (default 32)"
    )
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--k", type=positive_int, default=3, help="speculative tokens per step when serving (default 3)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for training, e.g. head.ttt_steps=3")
    args = p.parse_args(argv)
    if args.hybrid is None:  # the default: the hybrid wherever draftsmith.serve.hybrid serves the family
        args.hybrid = args.family in HYBRID_FAMILIES
    elif args.hybrid and args.family not in HYBRID_FAMILIES:
        p.error(f"--hybrid serves an EAGLE-3 head or an MLP speculator with suffix and ngram; not --family "
                f"{args.family} (draftsmith.serve.hybrid serves those two)")  # fmt: skip
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    n = 8 if args.hybrid else 7  # stages
    out = Path(args.out).resolve()
    stages = Stages()
    total = time.time()

    from draftsmith.assets import prepare_smollm2

    target = str(stages.run("prepare", f"1/{n} prepare target", prepare_smollm2))
    print(f"target: {target}")
    preset = PRESETS[args.family]
    rates = stages.run("probe", f"2/{n} probe this machine", lambda: probe(target, preset))
    key = {k: getattr(args, k) for k in ("budget", "full", "num_prompts", "max_tokens", "overrides")}
    if args.family != "eagle3":  # (plans written before --family existed stay valid for eagle3)
        key["family"] = args.family
    if args.hybrid:  # (and those written before --hybrid, without it)
        key["hybrid"] = True

    def new_plan() -> Plan:
        spent = sum(stages.spent.values())
        return make_plan(
            args.budget, rates, spent, args.num_prompts, args.max_tokens, args.full, args.hybrid, preset
        )  # fmt: skip

    try:
        plan = new_plan() if args.plan_only else load_or_plan(out, key, new_plan)
    except BudgetTooSmall as e:  # the probe's figures first: they are why the budget is too small here
        print(machine_line(rates), flush=True)
        print(f"draftsmith quickstart: {e}", file=sys.stderr)
        return 2
    print_plan(plan, rates, stages.spent)
    if args.plan_only:
        return 0

    from draftsmith.train.config import compose_config, validate_config

    overrides = plan.overrides(out, args.overrides, preset)
    validate_config(compose_config(overrides))  # a bad override fails here, before anything is prepared
    # data and extraction are one child (train/run.py prepare_only=true: the run's data, its features cached, its
    # held-out prompts), training another (the same overrides, the re-planned clock); each records how long its data
    # and features took, so the summary can split them
    prepare = [sys.executable, "-m", "draftsmith.train.run", *overrides, "prepare_only=true"]
    print("\n" + " ".join(prepare[1:]), flush=True)
    (out / "prepare_seconds.json").unlink(missing_ok=True)
    code = stages.run(
        "data+extract", f"3/{n} data and features (train/run.py prepare_only=true)", lambda: run_child(prepare)
    )
    split_child_stages(stages, "data+extract", out / "prepare_seconds.json")
    if code:  # the child printed its own one-paragraph error (or the Ctrl-C note) above
        print(f"draftsmith quickstart: data and features stopped (exit status {code}); re-run the same command "
              "to continue (finished shards are kept)", file=sys.stderr)  # fmt: skip
        return code

    def serve(heads: dict[str, str], hybrids: tuple[str, ...] = ()) -> dict:
        from draftsmith.eval.acceptance import run_acceptance
        from draftsmith.eval.acceptance_report import format_table
        from draftsmith.eval.prompts import humaneval_prompts, mtbench_file

        files = {"chat": out / "heldout_prompts.jsonl", "mtbench": mtbench_file()}
        if "code" in plan.workloads:  # HumanEval as a prompts file, once
            files["code"] = out / "humaneval_prompts.jsonl"
            files["code"].write_text("".join(json.dumps(r) + "\n" for r in humaneval_prompts()))
        results = {}
        for w in plan.workloads:
            print(f"\n--- {w} ---", flush=True)
            results[w] = run_acceptance(
                target,
                str(files[w]),
                list(SERVE_METHODS),
                heads,
                k=args.k,
                max_tokens=args.max_tokens,
                num_prompts=plan.num_prompts,
                out_dir=str(out / "acceptance" / w),
                batch_size=SERVE_BATCH,
                hybrids=hybrids,
                reuse_baselines=True,  # the head's run takes the baselines served before training
            )
            print(format_table(results[w]), flush=True)
        return results

    # the training-free methods first: they need no head, and what they take here sets the training clock
    baselines = stages.run(
        "baselines", f"4/{n} ngram, suffix and no speculation in vLLM (before training)", lambda: serve({})
    )
    if plan.replanned is None:
        plan.replanned = replan_training(plan, baselines, stages.spent["baselines"], time.time() - total)
        save_plan(out, key, plan)
        if plan.budget_min is not None:
            r = plan.replanned
            measured = f"served {r['serve_tok_s']:.0f} tok/s (planned {SERVE_TOK_S:g}); " if r["serve_tok_s"] else ""
            eta = time.time() - total + r["train_minutes"] * 60 + TRAIN_OVERHEAD_S + EXPORT_S + r["serve"]
            print(
                f"re-plan: {measured}the head's serving estimated at {fmt_min(r['serve'])} (planned "
                f"{fmt_min(plan.stages['serve'])}): {r['train_minutes']:g} training minutes (planned "
                f"{plan.train_minutes:g}), ETA +{fmt_min(eta)}",
                flush=True,
            )
    cmd = [sys.executable, "-m", "draftsmith.train.run", *plan.overrides(out, args.overrides, preset)]
    print("\n" + " ".join(cmd[1:]), flush=True)
    (out / "prepare_seconds.json").unlink(missing_ok=True)
    code = stages.run("train", f"5/{n} training (train/run.py)", lambda: run_child(cmd))
    split_child_stages(stages, "train", out / "prepare_seconds.json")  # reading the data and checking the features
    if code:  # training printed its own one-paragraph error (or the Ctrl-C note) above
        print(
            f"draftsmith quickstart: training stopped (exit status {code}); re-run the same command to continue "
            "from its last checkpoint",
            file=sys.stderr,
        )
        return code

    exported = out / "exported"

    def export() -> int:
        from draftsmith.cli import main as cli

        # recorded at the k it is measured and its hybrid fitted at, so `draftsmith serve` serves that k
        return cli(["export", "--format", "vllm", str(out), str(exported), "--k", str(args.k)])

    if stages.run("export", f"6/{n} export for vLLM", export) != 0:
        return 1
    fitted = None
    if plan.hybrid:
        title = f"7/{n} the hybrid policy (eval fit-hybrid)"
        fitted = stages.run("hybrid", title, lambda: fit_hybrid(out, target, args))
    hybrids = (args.family,) if fitted else ()
    results = stages.run(
        "serve",
        f"{n}/{n} the head{' and its hybrid' if hybrids else ''} in vLLM (the baselines' results reused)",
        lambda: serve({args.family: str(exported)}, hybrids),
    )
    spent_total = round(time.time() - total, 1)
    summary = write_summary(out, plan, rates, stages.spent, spent_total, results, args.family, fitted, tuple(argv))
    print("\n=== summary ===")
    print(summary["headline"])
    tr = summary["train"]
    print(
        f"\ntraining: {tr['tokens']:,} supervised tokens in {tr['steps']} steps at {tr['tok_per_s']:.0f} tok/s; "
        f"held-out per-step accuracy {[round(a, 3) for a in tr['eval_acc_per_step']]}"
    )
    print("planned / spent per stage: " + ", ".join(summary["stage_line"]))
    verdict = "within" if plan.budget_min is None or spent_total <= 60 * plan.budget_min else "OVER"
    budget = "" if plan.budget_min is None else f" of the {plan.budget_min:g}-minute budget ({verdict})"
    print(f"total {fmt_min(spent_total)}{budget}; results: {out}/quickstart.json")
    what = "the head with its hybrid" if fitted else "the head"
    print(f"serve {what} as measured (vLLM's OpenAI server, k={args.k}): draftsmith serve {exported}")
    return 0


def fit_hybrid(out: Path, target: str, args) -> dict | None:
    """--hybrid's fit on HYBRID_FIT first turns after the trained ones (the served chat prompts excluded), answered at
    the served length; the policy lands in the exported head's hybrid.json. None (and the head served alone) when it
    fails: the head is trained by then, and its table is still worth having."""
    from draftsmith.eval.hybrid import fit_hybrid as fit

    try:
        policy, _ = fit(
            target,
            out / "exported",
            None,
            num_conversations=HYBRID_FIT,
            max_tokens=args.max_tokens,
            k=args.k,
            exclude=out / "heldout_prompts.jsonl",
            records_path=out / "hybrid_records.json",  # a re-run refits from them without a forward pass
        )
    except Exception as e:  # noqa: BLE001 - reported, then the head is served alone
        print(f"draftsmith quickstart: the hybrid's fit failed ({type(e).__name__}: {e}); serving the head alone",
              file=sys.stderr)  # fmt: skip
        return None
    return {k: policy.fitted_on[k] for k in ("data", "skip", "conversations", "positions", "tokens_per_step")}


def split_child_stages(stages: Stages, child: str, marks: Path) -> None:
    """Split a train/run.py child's wall time from the marks it wrote: "data+extract" (prepare_only) into data and
    extract (its start-up counted with extraction), "train" into training and its own reading of the data and check
    of the features (added to data and extract)."""
    wall = stages.spent.pop(child)
    m = json.loads(marks.read_text()) if marks.is_file() else {}
    data, extract = m.get("data_s", 0.0), m.get("features_s", 0.0)
    if child == "data+extract":
        stages.spent.update({"data": round(data, 1), "extract": round(wall - data, 1)})
        return
    for name, seconds in (("data", data), ("extract", extract)):
        stages.spent[name] = round(stages.spent.get(name, 0.0) + seconds, 1)
    stages.spent["train"] = round(wall - data - extract, 1)


def stage_replans(plan: Plan) -> dict[str, float]:
    """The stages the re-plan after the baselines changed, in seconds (train: its clock plus the child's overhead)."""
    r = plan.replanned
    if not r or plan.budget_min is None:
        return {}
    return {"train": r["train_minutes"] * 60 + TRAIN_OVERHEAD_S, "serve": r["serve"]}


def write_summary(
    out: Path,
    plan: Plan,
    rates: Rates,
    spent: dict,
    total_s: float,
    results: dict,
    family: str = "eagle3",
    hybrid_fit: dict | None = None,
    argv: tuple[str, ...] = (),
) -> dict:
    from draftsmith.atomic import atomic_write_json

    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in log if "tok_per_s" in r][-1]
    last_eval = [r for r in log if "eval/acc" in r][-1]
    rows = served_rows(results)
    order = ["prepare", "probe", "data", "extract", "baselines", "train", "export", "hybrid", "serve"]
    replanned = stage_replans(plan)
    line = [
        f"{s} {fmt_min(plan.stages[s]) if s in plan.stages else '-'}"
        + (f" (re-planned {fmt_min(replanned[s])})" if s in replanned else "")
        + f" / {fmt_min(spent.get(s, 0))}"
        for s in order
        if s in spent or s in plan.stages
    ]
    summary = {
        "command": " ".join(["draftsmith", "quickstart", *argv]),
        "machine": {"cpu": rates.cpu, "flags": rates.flags, "threads": rates.threads, "bf16": rates.bf16},
        "probe": {"forward_tok_s": round(rates.forward_tok_s), "train_tok_s": round(rates.train_tok_s)},
        "plan": asdict(plan),
        "stage_seconds_planned": {k: round(v, 1) for k, v in plan.stages.items()},
        "stage_seconds_replanned": {k: round(v, 1) for k, v in replanned.items()},
        "stage_seconds_spent": spent,
        "total_seconds": total_s,
        "train": {
            "steps": last["step"],
            "tokens": last["tokens"],
            "tok_per_s": last["tok_per_s"],
            "eval_acc_per_step": last_eval["eval/acc"],
            "eval_sim_accept_len": last_eval["eval/sim_accept_len"],
        },
        "served": rows,
        "family": family,
        **({"hybrid_fit": hybrid_fit} if hybrid_fit else {}),
        "headline": headline(rows, rates, family),
        "stage_line": line,
    }
    atomic_write_json(out / "quickstart.json", summary)
    return summary
