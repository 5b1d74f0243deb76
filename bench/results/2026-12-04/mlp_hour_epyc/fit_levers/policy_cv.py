"""Offline A/B of hybrid-policy fits on saved per-position records: fit on a subset of conversations, simulate on
held-out conversations (by conversation), several splits."""
import json, sys, random
from draftsmith.eval.hybrid import fit_policy, simulate
from draftsmith.eval.reference_decoder import Proposal

recs = json.load(open(sys.argv[1]))["records"]
n = len(recs)
print("conversations", n, "positions", sum(map(len, recs)))

def dev_eval(policy, dev):
    def as_prop(rec):
        return {r: Proposal([0] * rec[r]["n"], signal=rec[r]["signal"]) for r in rec}
    from draftsmith.eval.hybrid import at_depth
    d = at_depth(dev, policy.depth) if policy.depth < policy.k else dev
    out = {"policy": simulate(d, lambda rec: policy.choose(as_prop(rec)))["tokens_per_step"]}
    for r in ("suffix", "ngram", "head"):
        out[r] = simulate(dev, lambda rec, r=r: r)["tokens_per_step"]
    out["oracle"] = simulate(d, lambda rec: max(rec, key=lambda r: (rec[r]["accepted"], -rec[r]["n"])))["tokens_per_step"]
    return out

rng = random.Random(0)
idx = list(range(n))
for split in range(3):
    rng.shuffle(idx)
    dev = [recs[i] for i in idx[: n // 4]]
    pool = [recs[i] for i in idx[n // 4 :]]
    for size in (16, 32, 64, 128, len(pool)):
        if size > len(pool):
            continue
        for bins in (8, 16, 32):
            for depth in (None,):
                pol, _ = fit_policy(pool[:size], 3, bins, depth)
                o = dev_eval(pol, dev)
                print(f"split {split} fit {size:4d} bins {bins:2d}: policy {o['policy']:.4f} suffix {o['suffix']:.4f} "
                      f"ratio {o['policy']/max(o['suffix'],o['ngram']):.4f} oracle {o['oracle']:.4f}")
