"""Offline A/B of hybrid-policy fits on saved per-position records: fit on a subset of conversations (16 ... all of
the 3/4 not held out) with 8 / 16 / 32 bins, simulate greedy decoding on the held-out 1/4 (by conversation), 3 splits.

    python policy_cv.py RECORDS.json
"""
import json
import random
import sys

from draftsmith.eval.hybrid import fit_policy, simulate
from draftsmith.eval.reference_decoder import Proposal

recs = json.load(open(sys.argv[1]))["records"]
n = len(recs)
print("conversations", n, "positions", sum(map(len, recs)))


def tokens_per_step(records, choose):
    return simulate(records, choose)["tokens_per_step"]


rng = random.Random(0)
idx = list(range(n))
for split in range(3):
    rng.shuffle(idx)
    dev = [recs[i] for i in idx[: n // 4]]
    pool = [recs[i] for i in idx[n // 4 :]]
    suffix, ngram = (tokens_per_step(dev, lambda rec, r=r: r) for r in ("suffix", "ngram"))
    oracle = tokens_per_step(dev, lambda rec: max(rec, key=lambda r: (rec[r]["accepted"], -rec[r]["n"])))
    for size in (16, 32, 64, 128, len(pool)):
        for bins in (8, 16, 32):
            pol, _ = fit_policy(pool[:size], 3, bins)
            policy = tokens_per_step(
                dev, lambda rec: pol.choose({r: Proposal([0] * rec[r]["n"], signal=rec[r]["signal"]) for r in rec})
            )
            print(f"split {split} fit {size:4d} bins {bins:2d}: policy {policy:.4f} suffix {suffix:.4f} "
                  f"ratio {policy / max(suffix, ngram):.4f} oracle {oracle:.4f}")
