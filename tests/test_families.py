"""The head-family table: every entry's callables exist, unknown names are refused naming the known ones, and the
table itself imports nothing heavy."""

import subprocess
import sys
from dataclasses import fields

import pytest

from draftsmith.errors import ConfigError
from draftsmith.train.heads import families
from draftsmith.train.heads.families import Ref


@pytest.mark.parametrize("name", families.NAMES)
def test_every_reference_resolves(name):
    family = families.get(name)
    assert family.name == name
    for f in fields(family):
        value = getattr(family, f.name)
        if isinstance(value, Ref):
            assert callable(value.load()), f"{name}.{f.name} = {value.path}"
    assert set(family.fields) <= {"aux", "last"} and "last" in family.fields
    from omegaconf import OmegaConf

    from draftsmith.train.config import HeadConfig

    objective = family.objective(OmegaConf.structured(HeadConfig(family=name)))
    assert objective.family == name  # what checkpoints record
    assert families.get(family.features_family).fields == family.fields  # what shard manifests record


def test_unknown_family_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"head.family='medusa': .*eagle3 \| peagle \| mlp_speculator"):
        families.get("medusa")
    with pytest.raises(ConfigError, match=r"run/head.json: records head family 'medusa'"):
        families.get("medusa", where="run/head.json")


def test_the_table_imports_no_torch():
    code = "import sys, draftsmith.train.heads.families; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
