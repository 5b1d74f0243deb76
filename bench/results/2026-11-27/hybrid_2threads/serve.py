"""Serve a head whose hybrid policy is fitted (`draftsmith eval fit-hybrid`) beside its hybrid and the training-free
methods, one run per workload (greedy, k=3, batch 1, 24 prompts).

    python serve.py OUT HEAD_DIR CHAT_PROMPTS.jsonl mtbench,chat[,code]"""
import json, subprocess, sys
from pathlib import Path
from draftsmith.eval.acceptance import run_acceptance
from draftsmith.eval.prompts import load_workload

out, head, chat = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
workloads = sys.argv[4].split(",") if len(sys.argv) > 4 else ["mtbench", "chat", "code"]
n = 24
sfile = out / "summary.json"
summary = json.loads(sfile.read_text()) if sfile.exists() else {}
for spec in workloads:
    if spec in summary:
        continue
    if spec == "chat":
        name, f = "chat", Path(chat)
    else:
        name, records, source = load_workload(spec, n, None)
        f = out / "workloads" / f"{name}.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps(r) + "\n" for r in records))
    r = run_acceptance("smollm2", str(f), ["none", "ngram", "suffix"], {"head": head}, k=3, max_tokens=128,
                       num_prompts=n, out_dir=str(out / name), batch_size=1, hybrids=("head",))
    summary[name] = {m: {k: row.get(k) for k in ("status", "mean_acceptance_length", "tokens_per_target_step",
                     "per_position_acceptance", "output_tokens_per_s", "match_vs_none", "hybrid")}
                     for m, row in r["methods"].items()}
    for m, row in summary[name].items():
        print(name, m, row["tokens_per_target_step"], row["output_tokens_per_s"], row["match_vs_none"], flush=True)
    sfile.write_text(json.dumps(summary, indent=1))
