# Shared by the MLP speculator's harnesses (bench/mlp_levers.sh, mlp_optim.sh, mlp_stage2.sh; mlp_hour.sh,
# quickstart_reserve.sh, quickstart_lever.sh, dflash_per_second.sh and dflash_equal_minutes.sh use `run`;
# per_second.sh, quickstart_lever.sh and dflash_per_second.sh `workload_prompts`); sourced, not run.
# The caller sets OUT and COMMON (the overrides every arm shares), calls `arm NAME OVERRIDES...` per arm (each adds
# itself to HEADS, the heads `serve` serves), then `serve RUN NUM_PROMPTS` once.
# DRY=1 prints every command ("+ ...") and runs none (tests/test_bench_scripts.py parses them).
DRY=${DRY:-0}
run() { echo "+ $*"; [ "$DRY" = 1 ] || "$@"; }
HEADS=()
workload_prompts() {  # workload_prompts RUN WORKLOAD: the prompt file WORKLOAD is served on (code: written into OUT)
  case $2 in
    chat) echo "$1/heldout_prompts.jsonl" ;;
    mtbench) python -c "from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())" ;;
    code) python -c "import sys; from draftsmith.eval.prompts import write_humaneval_prompts
write_humaneval_prompts(sys.argv[1])" "$OUT/humaneval_prompts.jsonl"
      echo "$OUT/humaneval_prompts.jsonl" ;;
    *) echo "unknown workload $2 (chat, mtbench, code)" >&2; exit 2 ;;
  esac
}
arm() {  # arm NAME OVERRIDES...: train and export once (a finished arm is kept), and serve it
  local name=$1
  shift
  [ -f "$OUT/$name/exported/config.json" ] || {
    run python train/run.py "${COMMON[@]}" "$@" "output_dir=$OUT/$name" resume=auto
    run draftsmith export --format vllm --force "$OUT/$name" "$OUT/$name/exported"
  }
  HEADS+=(--head "$name=$OUT/$name/exported")
}
serve() {  # serve RUN NUM_PROMPTS: every arm beside none, ngram and suffix on RUN's held-out chat prompts and MT-Bench
  local prompts mt
  mt=$(python -c "from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())")
  for w in chat mtbench; do
    prompts=$OUT/$1/heldout_prompts.jsonl
    [ "$w" = mtbench ] && prompts=$mt
    [ -f "$OUT/served_$w/acceptance.json" ] && continue
    run draftsmith eval acceptance --target smollm2 "${HEADS[@]}" --methods none,ngram,suffix --prompts "$prompts" \
      --num-prompts "$2" --k 3 --max-tokens 128 --batch-size 8 --out "$OUT/served_$w"
  done
}
