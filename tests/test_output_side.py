"""The EAGLE-3 head's output side from the target: head.init=output, head.freeze_lm_head and head.feature_loss, through
the real build and loop on the tiny target (CPU, seconds)."""

import pytest
import torch
from test_extract import data_file, overrides, train_in_process  # noqa: F401

from draftsmith.train.checkpoint import read_head
from draftsmith.train.config import compose_config, config_problems


def final_state(out_dir) -> dict[str, torch.Tensor]:
    return read_head(out_dir)[2]


def target_rows(target_dir, d2t: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    ids = torch.arange(d2t.numel()) + d2t  # the draft vocab's target ids
    return AutoModelForCausalLM.from_pretrained(target_dir).get_output_embeddings().weight[ids].detach().float()


def test_frozen_lm_head_keeps_the_targets_rows_and_the_feature_loss_adds_to_the_loss(
    tiny_target_dir, data_file, tmp_path
):
    args = lambda name, *extra: overrides(  # noqa: E731
        tiny_target_dir, data_file, tmp_path / name, "optim.max_steps=4", *extra
    )
    # every key named: the preset sets all three (eagle3_smollm2)
    train_in_process(args("trained", "head.init=output", "head.freeze_lm_head=false", "head.feature_loss=0"))
    frozen = train_in_process(args("frozen", "head.init=output", "head.freeze_lm_head=true", "head.feature_loss=0"))
    featured = train_in_process(
        args("featured", "head.init=output", "head.freeze_lm_head=true", "head.feature_loss=1.0")
    )

    a, b, c = (final_state(tmp_path / n) for n in ("trained", "frozen", "featured"))
    rows = target_rows(tiny_target_dir, a["d2t"])
    assert not torch.allclose(a["lm_head.weight"].float(), rows)  # trained: the rows moved
    for state in (b, c):  # frozen: still the target's rows, while the layer trained
        torch.testing.assert_close(state["lm_head.weight"].float(), rows, rtol=0, atol=0)
    assert not torch.equal(b["fc.weight"], a["fc.weight"])  # both trained; the frozen rows changed the path

    # the same start and first batch: the regression term adds to the first step's loss, the KL part is equal
    assert featured[0]["loss"] > frozen[0]["loss"] + 1e-3
    assert featured[0]["losses"] == frozen[0]["losses"] and featured[0]["acc"] == frozen[0]["acc"]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in featured)


@pytest.mark.parametrize(
    "extra,says",
    [
        (["head.init=random", "head.freeze_lm_head=true"], "head.freeze_lm_head=true with head.init=random"),
        (["head.feature_loss=-0.5"], "head.feature_loss=-0.5"),
    ],
)
def test_output_side_keys_are_refused_where_they_cannot_work(extra, says):
    problems = config_problems(compose_config(["conf=eagle3_smollm2", *extra]))
    assert any(p.startswith(says) for p in problems), problems
