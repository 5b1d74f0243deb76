"""The A/B's final heads beside ngram, suffix and no speculation on the bench prompts (MT-Bench, HumanEval), one run per workload."""
import json, sys
from pathlib import Path
from draftsmith.eval.acceptance import run_acceptance
from draftsmith.eval.prompts import load_workload

out = Path(sys.argv[1]); n = int(sys.argv[2]); heads = dict(x.split("=", 1) for x in sys.argv[3].split(","))
sfile = out / "summary.json"
summary = json.loads(sfile.read_text()) if sfile.exists() else {}
for spec in ("mtbench", "code"):
    name, records, source = load_workload(spec, n, None)
    f = out / "workloads" / f"{name}.jsonl"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    r = run_acceptance("smollm2", str(f), ["none", "ngram", "suffix"], heads, k=3, max_tokens=128, num_prompts=n,
                       out_dir=str(out / name), batch_size=8)
    summary[name] = {m: {k: row.get(k) for k in ("status", "mean_acceptance_length", "tokens_per_target_step",
                     "per_position_acceptance", "output_tokens_per_s", "match_vs_none")} for m, row in r["methods"].items()}
    for m, row in summary[name].items():
        print(name, m, row["tokens_per_target_step"], row["mean_acceptance_length"], row["match_vs_none"], flush=True)
    sfile.write_text(json.dumps(summary, indent=1))
