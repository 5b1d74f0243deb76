"""`draftsmith train --help` and the override check that runs before Hydra composes anything.

The help is generated from the schema (the dataclasses in train/config.py, their defaults and the comment beside each
field) and from the preset files' headers, so it cannot drift from what the run reads. The check turns Hydra's
composition errors into one paragraph that exits 2: a mistyped key names the closest real ones (Hydra's own hint,
"To append to your config use +key=...", would add an unused key), a missing preset lists the presets.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from dataclasses import MISSING, fields, is_dataclass

from draftsmith.errors import ConfigError

# the keys users set most, shown first with their schema comment; test_usage checks each exists
COMMON = [
    "target.name_or_path",
    "output_dir",
    "resume",
    "overwrite",
    "data.path",
    "data.num_conversations",
    "data.also",
    "data.max_length",
    "data.features",
    "data.features_dir",
    "head.draft_vocab_size",
    "head.ttt_steps",
    "optim.name",
    "optim.lr",
    "optim.max_minutes",
    "optim.max_tokens",
    "optim.epochs",
    "mixed_precision",
    "dry_run",
    "prepare_only",
]


def presets() -> dict[str, str]:
    """Preset name -> the first line of its header that describes it (after the launch command)."""
    from draftsmith.train.config import conf_dir

    out = {}
    for path in sorted((conf_dir() / "conf").glob("*.yaml")):
        lines = [x[2:].strip() for x in path.read_text().splitlines() if x.startswith("# ") and "@package" not in x]
        out[path.stem] = lines[1] if len(lines) > 1 else (lines[0] if lines else "")
    return out


def field_comments(cls) -> dict[str, str]:
    """{field: the comment on its line, or the comment lines just above it} from the dataclass's source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.lineno - 1]
            comment = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            above, i = [], node.lineno - 2
            while not comment and i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip()[1:].strip())
                i -= 1
            out[node.target.id] = comment or " ".join(above)
    return out


def schema_keys() -> dict[str, tuple[object, str]]:
    """Every config key as `group.key` -> (default, comment), from the schema dataclasses."""
    from draftsmith.train.config import Config

    out = {}

    def walk(cls, prefix: str) -> None:
        comments = field_comments(cls)
        for f in fields(cls):
            default = f.default if f.default_factory is MISSING else f.default_factory()
            if is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = (default, comments.get(f.name, ""))

    walk(Config, "")
    return out


def usage() -> str:
    keys = schema_keys()
    lines = [
        "usage: draftsmith train conf=PRESET [key=value ...]     (= python train/run.py / accelerate launch "
        "train/run.py)",
        "",
        "Presets (conf=NAME, conf/conf/*.yaml):",
    ]
    lines += [f"  {name:<17} {text}" for name, text in presets().items()]
    lines += ["", "Groups (one file each under conf/; a preset picks one of each): target/ head/ data/ optim/", ""]
    lines += ["Keys set most often (default, then what it does):"]
    for key in COMMON:
        default, comment = keys[key]
        lines.append(f"  {key:<24} {default!s:<10} {comment}"[:160])
    lines += [
        "",
        f"All {len(keys)} keys: train/config.py (one dataclass per group). A key that does not exist is refused "
        "with the closest ones; `dry_run=true` prints the memory per rank without loading anything.",
    ]
    return "\n".join(lines)


def check_overrides(argv: list[str]) -> None:
    """Compose the run's config from `argv` as Hydra will; a problem becomes one ConfigError naming it.

    The command line is read with Hydra's own argument parser, so its flags (`--cfg job`, `--info`, `-m`,
    `--config-name`, ...) mean what they mean to Hydra. A sweep (`optim.lr=1e-3,2e-3`, `range(...)`, `choice(...)`)
    needs `-m`; under `-m` each of its values is composed (with the other keys at their first value). With
    `--config-name` / `--config-dir` the config is not ours to check: Hydra composes and reports it."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from draftsmith.train.config import compose_config

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:  # argparse printed the usage error
        raise ConfigError(
            f"{' '.join(argv)}: not a command line Hydra reads (key=value overrides, plus Hydra's flags: --cfg "
            "job|hydra|all, --info, -m/--multirun, --config-name, --config-dir)"
        ) from None
    overrides = list(args.overrides)
    stray = [a for a in overrides if "=" not in a]
    if stray:
        raise ConfigError(
            f"{stray[0]!r} is not a key=value override. A value with a space must reach Hydra quoted, e.g. "
            """'output_dir="my runs/x"' (the shell's quotes around it, Hydra's inside)"""
        )
    for a in overrides:
        key, value = a.split("=", 1)
        if any(c.isspace() for c in value) and value[:1] not in "'\"" and not re.match(r"\w+\(", value):
            raise ConfigError(
                f"{a}: the value holds a space; quote it for Hydra inside the shell's quotes: '{key}=\"{value}\"'"
            )
    if args.config_name or args.config_dir or args.config_path:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"{' '.join(overrides)}: {e}") from None
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if sweeps and not args.multirun:
        raise ConfigError(
            f"{sweeps[0].input_line} is a sweep (one job per value): add -m (--multirun) to run it, e.g. "
            f"python train/run.py -m {' '.join(overrides)}; each job trains into its own output_dir/<job number>"
        )
    choices = []  # per override: the values to compose it with (one for a plain override)
    for o in parsed:
        if not o.is_sweep_override():
            choices.append([o.input_line])
        elif o.is_choice_sweep() or o.is_range_sweep():
            choices.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:  # an interval sweep (a sweeper plugin samples it): checked by Hydra when the job starts
            choices.append([])
    names = list(presets())
    composed = [[c[0] for c in choices if c]]  # every key at its first value, then each sweep value in turn
    for i, values in enumerate(choices):
        for v in values[1:]:
            composed.append([v if j == i else c[0] for j, c in enumerate(choices) if c])
    for combo in composed:
        for a in combo:
            key, value = a.split("=", 1)
            if key == "conf" and value not in names:
                raise ConfigError(f"conf={value}: no such preset{_closest(value, names)}; presets: {', '.join(names)}")
        try:
            compose_config(combo)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(_explain(str(e), combo)) from None


def _closest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def _explain(message: str, overrides: list[str]) -> str:
    """Hydra's composition error as our paragraph: the key, why, and (for a typo) the closest real keys."""
    lines = [x.strip() for x in message.strip().splitlines() if x.strip() and not x.strip().startswith("To append")]
    keys = schema_keys()
    given = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    unknown = [k for k in given if k not in keys and k.split(".", 1)[0] not in ("hydra", "conf", "wandb")]
    unknown = [k for k in unknown if not any(q.startswith(k + ".") for q in keys)]  # a whole group is a key too
    if unknown:
        return "; ".join(f"{k}: no such config key{_closest(k, list(keys))}" for k in unknown) + (
            "; `draftsmith train --help` lists the keys set most (all of them: train/config.py)"
        )
    return " ".join(lines[:3])
