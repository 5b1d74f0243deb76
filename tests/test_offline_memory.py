"""A training rank on stored features holds the target's ends only: measured on SmolLM2 (slow tier)."""

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def test_offline_training_rank_leaves_the_decoder_layers_out(smollm2_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "bench"))
    from offline_rss import measure

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(smollm2_dir))
    layers = 4 * sum(p.numel() for p in model.model.layers.parameters())  # fp32 bytes a rank no longer holds
    r = measure(tmp_path)
    print(
        f"\npeak RSS online {r['online_peak_bytes'] / 2**20:.0f} MiB, offline {r['offline_peak_bytes'] / 2**20:.0f} "
        f"MiB (ratio {r['ratio']:.2f}); decoder layers {layers / 2**20:.0f} MiB"
    )
    assert r["saved_bytes"] > 0.5 * layers, r
    online, offline = (torch.tensor(r["losses"][k], dtype=torch.float64) for k in ("online", "offline"))
    torch.testing.assert_close(offline, online, rtol=0, atol=1e-5)  # fp32 features: the same training
