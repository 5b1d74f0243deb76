"""Run one prompt through vLLM EAGLE-3 speculative decoding and record what the draft head sees.

Usage: python tests/vllm_probe.py TARGET_DIR HEAD_DIR PROMPT_IDS_JSON OUT.pt [EXTRA_SPECULATIVE_CONFIG_JSON]
Saves: the first fc input vLLM builds from the target's aux states ([N, 3H], the prefill rows), the
draft logits of each draft step of the first speculation round, generated token ids, and the spec-decode counters.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the in-process CPU engine loop fights a second OpenMP thread

CAPTURE: dict = {}


def install_hooks(worker):
    drafter = worker.model_runner.drafter.model

    def on_fc(module, args):
        CAPTURE.setdefault("fc_input", args[0].detach().clone())

    drafter.model.fc.register_forward_pre_hook(on_fc)
    original = drafter.compute_logits

    def compute_logits(hidden_states):
        out = original(hidden_states)
        CAPTURE.setdefault("draft_logits_calls", []).append(out.detach().clone())  # step 0, step 1, ...
        return out

    drafter.compute_logits = compute_logits
    return type(drafter).__name__


def main():
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    target, head, prompt_json, out = sys.argv[1:5]
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # e.g. {"parallel_drafting": true}
    prompt_ids = json.loads(prompt_json)
    llm = LLM(
        model=target,
        speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": 3, **extra},
        enforce_eager=True,
        dtype="float32",
        max_model_len=512,
        disable_log_stats=False,
        seed=0,
    )
    arch = llm.collective_rpc(install_hooks)[0]
    res = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], SamplingParams(temperature=0, max_tokens=16))
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            metrics[m.name] = getattr(m, "values", None) or getattr(m, "value", None)
    torch.save({**CAPTURE, "generated": list(res[0].outputs[0].token_ids), "metrics": metrics, "arch": arch}, out)


if __name__ == "__main__":
    main()
