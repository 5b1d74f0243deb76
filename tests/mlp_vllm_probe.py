"""Serve an exported MLP speculator in vLLM (custom_class) and record what the drafter sees and proposes.

Usage: python tests/mlp_vllm_probe.py TARGET_DIR HEAD_DIR PROMPTS_JSON K OUT.pt
Saves, per propose() call that drafted: each drafting request's token history (from vLLM's own buffers),
the hidden state and token handed to the speculator, the drafts; plus outputs and spec-decode counters.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

CALLS: list = []


def install(worker):
    drafter = worker.model_runner.drafter
    head = drafter.head
    original_propose, original_chain = drafter.propose, head.propose
    seen = {}

    def chain(hidden, token, k=None):
        out = original_chain(hidden, token, k)
        seen.update(hidden=hidden.clone(), token=token.clone(), drafts=out.clone())
        return out

    def propose(sampled, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kw):
        seen.clear()
        drafts = original_propose(sampled, num_tokens_no_spec, token_ids_cpu, slot_mappings=slot_mappings, **kw)
        if seen:
            reqs = [i for i, d in enumerate(drafts) if d]
            CALLS.append({"histories": [token_ids_cpu[i, : int(num_tokens_no_spec[i])].tolist() for i in reqs], **seen})
        return drafts

    head.propose = chain
    drafter.propose = propose
    return type(drafter).__name__


def main():
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from draftsmith.serve.plugin import speculative_kwargs

    target, head_dir, prompts_json, k, out = sys.argv[1:6]
    prompts = json.loads(prompts_json)
    if head_dir.endswith(".MLPSpeculator"):  # the plugin path: the directory itself names the class
        spec = {"speculative_config": {"method": "custom_class", "model": head_dir, "num_speculative_tokens": int(k)}}
    else:
        spec = speculative_kwargs(head_dir, int(k)) if head_dir != "none" else {}
    llm = LLM(
        model=target, enforce_eager=True, dtype="float32", max_model_len=256, disable_log_stats=False, seed=0, **spec
    )
    cls = llm.collective_rpc(install)[0] if spec else None
    res = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], SamplingParams(temperature=0, max_tokens=24)
    )
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            metrics[m.name] = getattr(m, "values", None) or getattr(m, "value", None)
    torch.save(
        {"calls": CALLS, "outputs": [list(r.outputs[0].token_ids) for r in res], "metrics": metrics, "drafter": cls},
        out,
    )


if __name__ == "__main__":
    main()
