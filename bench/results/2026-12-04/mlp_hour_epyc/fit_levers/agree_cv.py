"""CV: the current policy (independent calibrations) against one calibrated per agreement state (does the member's
first draft token equal another member's?), fitted on 3/4 of the conversations, simulated on the rest."""
import json, sys, random
from draftsmith.eval.hybrid import fit_policy, simulate, calibrate
from draftsmith.eval.reference_decoder import Proposal

recs = json.load(open(sys.argv[1]))["records"]
bins = int(sys.argv[2]) if len(sys.argv) > 2 else 16
ROLES = ("head", "ngram", "suffix")
PREF = ("ngram", "suffix", "head")

def state(rec, r):
    t = rec[r].get("t") or []
    if not t:
        return None
    others = [rec[o]["t"][0] for o in rec if o != r and rec[o].get("t")]
    if not others:
        return "alone"
    return "agree" if t[0] in others else "differ"

def fit_agree(train):
    cal = {}
    for r in ROLES:
        for s in ("alone", "agree", "differ"):
            pts = [(rec[r]["signal"], rec[r]["accepted"]) for c in train for rec in c if rec[r]["n"] and state(rec, r) == s]
            cal[(r, s)] = calibrate([p for p, _ in pts], [a for _, a in pts], bins) if len(pts) >= 50 else None
        pts = [(rec[r]["signal"], rec[r]["accepted"]) for c in train for rec in c if rec[r]["n"]]
        cal[(r, "all")] = calibrate([p for p, _ in pts], [a for _, a in pts], bins)
    def choose(rec):
        best = None
        for r in PREF:
            if not rec[r]["n"]:
                continue
            c = cal[(r, state(rec, r))] or cal[(r, "all")]
            e = (c.expect(rec[r]["signal"]), -PREF.index(r))
            if best is None or e > best[0]:
                best = (e, r)
        return best[1] if best else None
    return choose

def as_prop(rec):
    return {r: Proposal([0] * rec[r]["n"], signal=rec[r]["signal"]) for r in rec}

rng = random.Random(0)
idx = list(range(len(recs)))
tot = {"base": [], "agree": [], "suffix": [], "oracle": []}
for split in range(4):
    rng.shuffle(idx)
    dev = [recs[i] for i in idx[: len(idx) // 4]]
    train = [recs[i] for i in idx[len(idx) // 4 :]]
    pol, _ = fit_policy(train, 3, bins)
    b = simulate(dev, lambda rec: pol.choose(as_prop(rec)))["tokens_per_step"]
    a = simulate(dev, fit_agree(train))["tokens_per_step"]
    s = max(simulate(dev, lambda rec, r=r: r)["tokens_per_step"] for r in ("suffix", "ngram"))
    o = simulate(dev, lambda rec: max(rec, key=lambda r: (rec[r]["accepted"], -rec[r]["n"])))["tokens_per_step"]
    print(f"split {split}: base {b:.4f} ({b/s:.4f}x)  agree {a:.4f} ({a/s:.4f}x)  best-free {s:.4f}  oracle {o:.4f}")
    for k_, v in (("base", b), ("agree", a), ("suffix", s), ("oracle", o)):
        tot[k_].append(v)
print({k_: round(sum(v) / len(v), 4) for k_, v in tot.items()})
