#!/bin/bash
# `draftsmith adapt` on the issue's bench: the quickstart's chat-only head, adapted for MINUTES on 500 code prompts it
# never saw, judged on the traffic's held-out slice, its own held-out chat prompts and MT-Bench.
#
#   bash bench/adapt_code.sh OUT [HEAD] [MINUTES] [REPLAY...]
#
# HEAD: a quickstart run dir (`draftsmith quickstart --out DIR`: the target's answers to ShareGPT first turns alone,
#       data.also=[]); without it this script runs `draftsmith quickstart --out OUT/head` first.
# The traffic: OUT/traffic.jsonl, OpenAI chat-completions requests (one JSON object per line) for the code-completion
#       prompts 1,200-1,699 of pycode:site-packages (signature + docstring of a documented function of the installed
#       packages: HumanEval's shape, none of HumanEval's problems, none of the 1,200 the full preset trains on), plus
#       every 10th of them sent again (real traffic repeats itself; adapt counts a prompt once).
# Each REPLAY (default 0.5) is one `draftsmith adapt HEAD --traffic OUT/traffic.jsonl --minutes MINUTES --replay R
#       --out OUT/replay_R/exported --work OUT/replay_R --baselines` with nothing else added: served in vLLM, 32
#       prompts per workload, greedy, k=3, 128 tokens, batch 8. Later REPLAY values take the first one's answers to the
#       traffic (the same prompts, target and settings) instead of generating them again.
set -euo pipefail
OUT=${1:?usage: bench/adapt_code.sh OUT [HEAD] [MINUTES] [REPLAY...]}
HEAD=${2:-}
MINUTES=${3:-15}
shift $(( $# < 3 ? $# : 3 ))
REPLAYS=("${@:-0.5}")
[ ${#REPLAYS[@]} -eq 0 ] && REPLAYS=(0.5)
mkdir -p "$OUT"
if [ -z "$HEAD" ]; then
  HEAD=$OUT/head
  draftsmith quickstart --out "$HEAD"
fi
if [ ! -s "$OUT/traffic.jsonl" ]; then
  python - "$OUT/traffic.jsonl" <<'PY'
import json, sys
from draftsmith.train.data.conversations import read_conversations
convs = list(read_conversations("pycode:site-packages:1700", questions=True))[1200:1700]
lines = [json.dumps({"model": "smollm2", "messages": c.messages, "max_tokens": 256, "temperature": 0}) for c in convs]
lines += lines[::10]
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"traffic: {len(lines)} requests, {len(convs)} distinct prompts -> {sys.argv[1]}")
PY
fi
FIRST=""
for r in "${REPLAYS[@]}"; do
  work=$OUT/replay_$r
  if [ -n "$FIRST" ] && [ ! -e "$work/traffic_answers.jsonl" ]; then
    mkdir -p "$work"
    cp "$FIRST/traffic_answers.jsonl" "$work/"
    # the pool's settings name the prompts file by path: the same prompts (same traffic, same hash split), new path
    python - "$FIRST/traffic_answers.jsonl.meta.json" "$work" <<'PY'
import json, os, sys
meta = json.load(open(sys.argv[1]))
meta.update(data=os.path.abspath(f"{sys.argv[2]}/traffic_train.jsonl"), out=f"{sys.argv[2]}/traffic_answers.jsonl")
json.dump(meta, open(f"{sys.argv[2]}/traffic_answers.jsonl.meta.json", "w"), indent=2)
PY
  fi
  status=0
  draftsmith adapt "$HEAD" --traffic "$OUT/traffic.jsonl" --minutes "$MINUTES" --replay "$r" \
    --out "$work/exported" --work "$work" --baselines || status=$?
  [ "$status" -eq 0 ] || [ "$status" -eq 3 ] || exit "$status"  # 3: judged, not promoted
  FIRST=${FIRST:-$work}
done
