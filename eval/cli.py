r"""`draftsmith eval acceptance`: measure draft acceptance in real vLLM speculative decoding.

    draftsmith eval acceptance --target smollm2 --methods none,ngram,suffix \
        --prompts ../shared/data/spec_bench_questions.jsonl --num-prompts 20 --k 3 --out runs/acceptance
    draftsmith eval acceptance --target smollm2 --head mine=exported/eagle3_smollm2 \
        --prompts ../shared/data/gsm8k_test.jsonl --num-prompts 50 --k 3 --out runs/acceptance_gsm8k
    draftsmith eval acceptance --target smollm2 --head mine=exported/eagle3_smollm2 \
        --prompts ../shared/data/spec_bench_questions.jsonl --category summarization --num-prompts 16 --out runs/sum

Writes OUT/acceptance.json (every figure, versions, exact speculative configs), OUT/acceptance.md and
OUT/runs/ (per method: the job, vLLM's log, the generated token ids).

With --batch-sizes 1,4,8,16 every method serves the prompts once per batch size (concurrent requests), a fresh engine
each time (a warm one would serve repeated prompts from its prefix cache, and suffix decoding from answers it saw):
OUT/sweep.md, OUT/plots/speedup_vs_batch.png and acceptance.json's "sweep". `draftsmith eval schedule` turns such
runs into the k per batch size that serves a head fastest, which --k-schedule serves.

With any of --workloads, --ks, --temperatures it runs the whole matrix instead (methods × workloads × k ×
temperature, served and reference decoder, report and plots; `draftsmith eval matrix --help`):

    draftsmith eval acceptance --target smollm2 --head mine=outputs/quickstart \
        --workloads chat=outputs/quickstart/heldout_prompts.jsonl,mtbench,code --ks 1-7 --temperatures 0,1 \
        --num-prompts 16 --out runs/matrix

A running server (draftsmith serve, or any vLLM server) is measured over HTTP by `draftsmith eval live --server URL`
(`draftsmith eval live --help`).
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.argtypes import positive_int
from draftsmith.eval.acceptance import run_acceptance
from draftsmith.eval.acceptance_plan import ENGINE_DEFAULTS
from draftsmith.eval.acceptance_report import RESULT_COLUMNS, result_cells
from draftsmith.eval.args import head_arg, json_object, methods_arg
from draftsmith.eval.methods import BASELINES
from draftsmith.eval.prompts import PromptFileError
from draftsmith.serve.recipe import ScheduleError, read_schedule


def rich_table(result: dict):
    """The result as a rich Table for the console (the markdown twin is `format_table`)."""
    from rich.table import Table

    table = Table(
        title=f"served acceptance, k={result['k']}, {result['num_prompts']} prompts, "
        f"max_tokens={result['max_tokens']}, T={result['temperature']}"
    )
    for col in RESULT_COLUMNS:
        table.add_column(col, justify="left" if col in ("method", "accept/pos") else "right")
    for name, r in result["methods"].items():
        if r["status"] != "ok":
            table.add_row(name, f"[red]failed[/]: {r['error'][:60]}")
            continue
        table.add_row(*result_cells(name, r))
    return table


MATRIX_FLAGS = ("--workloads", "--ks", "--temperatures", "--no-served", "--no-reference")


def acceptance(argv: list[str]) -> int:
    if any(a.split("=")[0] in MATRIX_FLAGS for a in argv):  # a sweep: the matrix runs it (same flags, more axes)
        return matrix(argv)
    p = argparse.ArgumentParser(
        prog="draftsmith eval acceptance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", required=True, help="target HF dir or hub id, or `smollm2` (the embedded default)")
    p.add_argument(
        "--head",
        type=head_arg,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="an exported head dir (EAGLE-3 or MLP speculator) to run as method NAME (repeatable)",
    )
    p.add_argument(
        "--hybrid",
        action="append",
        default=[],
        metavar="NAME",
        help="also serve head NAME as hybrid(NAME): its fitted hybrid.json picks head/suffix/ngram per step "
        "(`draftsmith eval fit-hybrid`; repeatable)",
    )
    p.add_argument(
        "--methods",
        type=methods_arg,
        default=list(BASELINES),
        help=f"comma-separated built-in methods (default {','.join(BASELINES)}; '' for heads only)",
    )
    p.add_argument("--prompts", required=True, help="JSONL of {messages}|{prompt}|{turns}|{question}")
    p.add_argument("--num-prompts", type=positive_int, default=None, help="the first N prompts (default: all)")
    p.add_argument(
        "--category",
        type=lambda s: [c for c in s.split(",") if c],
        default=None,
        help="only the prompts of these comma-separated `category` values, --num-prompts of each "
        "(Spec-Bench: translation, summarization, qa, math_reasoning, rag, and MT-Bench's eight)",
    )
    p.add_argument("--k", type=positive_int, default=3, help="speculative tokens per step")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=ENGINE_DEFAULTS["dtype"], choices=["float32", "bfloat16", "float16", "auto"])
    p.add_argument("--ngram-min", type=int, default=ENGINE_DEFAULTS["ngram_min"], help="shortest n-gram looked up")
    p.add_argument("--ngram-max", type=int, default=ENGINE_DEFAULTS["ngram_max"], help="longest n-gram looked up")
    p.add_argument(
        "--batch-size",
        type=int,
        default=ENGINE_DEFAULTS["batch_size"],
        help="prompts per generate call (1 = latency regime)",
    )
    p.add_argument(
        "--batch-sizes",
        default=None,
        metavar="1,4,8,16",
        help="a sweep: every prompt once per batch size, a fresh engine each (OUT/sweep.md and a plot)",
    )
    p.add_argument(
        "--parallel-drafting",
        choices=["auto", "on", "off"],
        default="auto",
        help="heads: auto = as trained (P-EAGLE heads in one forward); on / off insist (a head not trained so is "
        "refused)",
    )
    p.add_argument("--max-num-seqs", type=int, default=None, help="the engine's most concurrent requests")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="a sweep served N times, round by round; each speed-up is the median of the rounds' ratios to no "
        "speculation in the same round (for machines whose speed drifts)",
    )
    p.add_argument(
        "--k-schedule",
        action="append",
        default=[],
        metavar="[HEAD=]JSON|FILE",
        help="heads: vLLM's num_speculative_tokens_per_batch_size, e.g. '[[1,4,3],[5,256,0]]', or a schedule.json "
        "from `draftsmith eval schedule`; HEAD=... for one head (repeatable), else for every head",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=None,
        help="VLLM_CPU_KVCACHE_SPACE for each engine (default: the environment's, else 2)",
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default: longest prompt + max_tokens + k + 1")
    p.add_argument(
        "--chat-template-kwargs",
        type=json_object,
        default=None,
        metavar="JSON",
        help="render the prompts with these chat template variables, as the deployment passes them to vLLM, e.g. "
        "'{\"enable_thinking\": false}' for Qwen3 without reasoning (train with the same data.chat_template_kwargs)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS per engine (default: the environment's, else 1; reported)",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds per method before it is killed")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args(argv)
    if args.k < 1 or args.max_tokens < 1:
        p.error("--k and --max-tokens must be >= 1")
    sizes = None
    if args.batch_sizes is not None:
        try:
            sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        except ValueError:
            p.error(f"--batch-sizes {args.batch_sizes!r}: comma-separated integers, e.g. 1,4,8,16")

    from rich.console import Console

    try:
        schedule = None
        for text in args.k_schedule:
            name, sep, rest = text.partition("=")
            if sep and name in dict(args.head):
                schedule = {**(schedule or {}), name: read_schedule(rest)}
            elif len(args.k_schedule) == 1:
                schedule = read_schedule(text)
            else:
                raise ScheduleError(
                    f"--k-schedule {text!r}: several schedules need HEAD=... each (heads: {', '.join(dict(args.head))})"
                )
        result = run_acceptance(
            args.target,
            args.prompts,
            args.methods,
            dict(args.head),
            k=args.k,
            max_tokens=args.max_tokens,
            num_prompts=args.num_prompts,
            categories=args.category,
            out_dir=args.out,
            temperature=args.temperature,
            seed=args.seed,
            dtype=args.dtype,
            ngram_min=args.ngram_min,
            ngram_max=args.ngram_max,
            batch_size=args.batch_size,
            batch_sizes=sizes,
            max_num_seqs=args.max_num_seqs,
            repeats=args.repeats,
            k_schedule=schedule,
            parallel_drafting={"auto": None, "on": True, "off": False}[args.parallel_drafting],
            kv_cache_gib=args.kv_cache_gib,
            max_model_len=args.max_model_len,
            chat_template_kwargs=args.chat_template_kwargs,
            threads=args.threads,
            timeout_s=args.timeout,
            hybrids=tuple(args.hybrid),
        )
    except (PromptFileError, FileNotFoundError, ValueError, ScheduleError) as e:
        print(f"draftsmith eval acceptance: {e}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 150)  # logs get the whole table, unwrapped
    console.print(rich_table(result))
    console.print(f"wrote {args.out}/acceptance.json and {args.out}/acceptance.md")
    if sizes:
        from pathlib import Path

        console.print(Path(args.out, "sweep.md").read_text(), markup=False, highlight=False)
        console.print(f"wrote {args.out}/sweep.md and {args.out}/plots/speedup_vs_batch.png")
    failed = [n for n, r in result["methods"].items() if r["status"] != "ok"]
    if failed:
        console.print(f"[red]failed methods: {', '.join(failed)}[/] (logs under {args.out}/runs/)")
    return 1 if failed else 0


def matrix(argv: list[str]) -> int:
    """`draftsmith eval matrix`: methods × workloads × k × temperature, served + reference, report and plots."""
    from draftsmith.eval.matrix import main as matrix_main

    return matrix_main(argv)


def schedule(argv: list[str]) -> int:
    """`draftsmith eval schedule`: the k per batch size that serves a head fastest, from batch-size sweeps."""
    from draftsmith.eval.schedule import main as schedule_main

    return schedule_main(argv)


def fit_hybrid(argv: list[str]) -> int:
    """`draftsmith eval fit-hybrid`: fit a head's hybrid policy (head vs suffix/ngram per step) on training data."""
    from draftsmith.eval.hybrid import main as fit_main

    return fit_main(argv)


def live(argv: list[str]) -> int:
    """`draftsmith eval live`: a running vLLM server measured over HTTP (latency, throughput, /metrics acceptance)."""
    from draftsmith.eval.live import main as live_main

    return live_main(argv)


COMMANDS = {"acceptance": acceptance, "matrix": matrix, "schedule": schedule, "fit-hybrid": fit_hybrid, "live": live}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(
            "usage: draftsmith eval {acceptance,matrix,schedule,fit-hybrid,live} [--help] ...\n\n" + (__doc__ or ""),
            file=sys.stderr,
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
