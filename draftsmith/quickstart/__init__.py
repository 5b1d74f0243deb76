"""`draftsmith quickstart`: a first EAGLE-3 head for the embedded default, end to end, within a time budget.

    draftsmith quickstart                  # 45 minutes after set-up, planned from a probe of this machine
    draftsmith quickstart --budget 90      # more data and training minutes
    draftsmith quickstart --full           # the preset as measured: its data (turns + code sets), 60 training minutes
    draftsmith quickstart --family peagle  # a parallel-drafting (P-EAGLE) head instead: same plan, data and clock
    draftsmith quickstart --family dflash  # a DFlash block drafter (one non-causal forward drafts the block)
    draftsmith quickstart --family mlp     # an MLP speculator (IBM), served through draftsmith's vLLM plugin
    draftsmith quickstart --no-hybrid      # the head alone: no hybrid fitted or served, its minutes go to training

Stages: prepare the target (SmolLM2-135M-Instruct GGUF -> HF dir, once) -> probe this machine (target forward,
head training step: seconds) -> plan -> the target's own answers to ShareGPT first turns and to stdlib code-completion
prompts (a share of the data; both shipped with the package for this target, regenerated where anything differs) and
their features (extracted once, cached) -> ngram, suffix and no speculation served in real vLLM on held-out chat
prompts, MT-Bench and HumanEval (HumanEval where the budget holds it on this machine), before
training: what they take here re-plans the training minutes to fill the rest of the budget -> train the head
(train/run.py conf=eagle3_smollm2, the re-planned minutes on the clock) -> export for vLLM -> the head served on the
same prompts, beside the baselines' results; for an EAGLE-3 head or an MLP speculator (not with --no-hybrid), first
the head's hybrid policy is fitted on first turns it never trained on, and hybrid(HEAD) (per step the head's draft,
suffix's or ngram's) is served beside it. The plan with an ETA per stage prints before anything
runs; the last lines compare planned (and re-planned) with spent time per stage. Everything lands in
<out>/quickstart.json. Re-running the same command continues from the last checkpoint (the plan in <out>/plan.json is
reused, its re-planned clock with it, and the baselines already served are not served again).
"""

from draftsmith.quickstart.run import main

__all__ = ["main"]
