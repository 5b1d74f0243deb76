"""Record the fit's per-position records like `draftsmith eval fit-hybrid --records` (same identity, so a later
fit-hybrid with the same head/conversations reads them back), adding each member's draft tokens ("t").

    python record_with_drafts.py HEAD_DIR HELDOUT_JSONL N OUT.json [M]   (M: also write OUT_M.json, the first M's)
"""
import sys
from pathlib import Path

import draftsmith.eval.hybrid as H
from draftsmith.assets import resolve_target
from draftsmith.atomic import atomic_write_json
from draftsmith.eval.reference_decoder import load_head_drafter
from draftsmith.train.checkpoint import read_head

ROLES = ("head", "ngram", "suffix")
head_dir, exclude, n, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
target = resolve_target("smollm2")


def conversations(num):
    return H.fit_conversations(target, head_dir, None, num, 256, None, exclude, 0.0, 0, "auto")[3]


convs = conversations(n)
family, cfg, state, _ = read_head(head_dir)
digest = H._head_digest(family.name, cfg, state)
tgt = H.Target.from_pretrained(target, aux_layer_ids=cfg.get("aux_layer_ids") or [0])
members = H.hybrid_members(load_head_drafter("head", head_dir, tgt)[0], ROLES)

# record_positions scores each member's draft with _matched, once per member per position in members' order
drafts, matched = [], H._matched
H._matched = lambda draft, ahead: drafts.append(list(map(int, draft))) or matched(draft, ahead)
recs = H.record_positions(tgt, members, convs, 3, lambda i, m: print(f"recorded {i}/{m}", flush=True))
it = iter(drafts)
for conv in recs:
    for rec in conv:
        for role in members:
            rec[role]["t"] = next(it)
assert next(it, None) is None
atomic_write_json(out, {"identity": H.records_identity(digest, convs, 3, ROLES), "records": recs}, indent=None)
print("wrote", out, len(recs), sum(map(len, recs)))
if len(sys.argv) > 5:  # the records of a smaller default fit (64 conversations): a prefix of these, its own identity
    m = int(sys.argv[5])
    convs_m = conversations(m)
    assert convs_m == convs[: len(convs_m)], "the smaller fit's conversations are not a prefix"
    out_m = out.with_name(out.stem + f"_{m}.json")
    atomic_write_json(out_m, {"identity": H.records_identity(digest, convs_m, 3, ROLES), "records": recs[: len(convs_m)]}, indent=None)
    print("wrote", out_m, len(convs_m))
