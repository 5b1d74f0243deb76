"""Record the fit's per-position records like `draftsmith eval fit-hybrid --records` (same identity, so a later
fit-hybrid with the same head/conversations reads them back), adding each member's draft tokens ("t")."""
import hashlib, json, sys
from pathlib import Path
import torch
import draftsmith.eval.hybrid as H
from draftsmith.assets import resolve_target
from draftsmith.train.checkpoint import read_head
from draftsmith.eval.reference_decoder import load_head_drafter
from draftsmith.atomic import atomic_write_json

head_dir, exclude, n, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
target = resolve_target("smollm2")
data, skip, prompts, convs = H.fit_conversations(target, head_dir, None, n, 256, None, exclude, 0.0, 0, "auto")
family, cfg, state, _ = read_head(head_dir)
identity = {"format": "draftsmith-hybrid-records-1", "head": H._head_digest(family.name, cfg, state),
            "conversations": hashlib.sha1(json.dumps(convs).encode()).hexdigest(), "k": 3,
            "roles": ["head", "ngram", "suffix"]}
tgt = H.Target.from_pretrained(target, aux_layer_ids=cfg.get("aux_layer_ids") or [0])
head = load_head_drafter("head", head_dir, tgt)[0]
members = H.hybrid_members(head, ("head", "ngram", "suffix"))
orig = H._matched
drafts = []
def matched(draft, ahead):
    drafts.append(list(map(int, draft)))
    return orig(draft, ahead)
H._matched = matched
recs = H.record_positions(tgt, members, convs, 3, lambda i, m: print(f"recorded {i}/{m}", flush=True))
# record_positions calls _matched once per member per position, in members' order
it = iter(drafts)
for conv in recs:
    for rec in conv:
        for role in members:
            rec[role]["t"] = next(it)
assert next(it, None) is None
atomic_write_json(out, {"identity": identity, "records": recs}, indent=None)
print("wrote", out, len(recs), sum(map(len, recs)))
# the records of a default fit (64 conversations): a prefix of these, under its own identity
if len(sys.argv) > 5:
    m = int(sys.argv[5])
    _, _, _, convs_m = H.fit_conversations(target, head_dir, None, m, 256, None, exclude, 0.0, 0, "auto")
    assert convs_m == convs[: len(convs_m)], "the smaller fit's conversations are not a prefix"
    ident_m = {**identity, "conversations": hashlib.sha1(json.dumps(convs_m).encode()).hexdigest()}
    out_m = out.with_name(out.stem + f"_{m}.json")
    atomic_write_json(out_m, {"identity": ident_m, "records": recs[: len(convs_m)]}, indent=None)
    print("wrote", out_m, len(convs_m))
