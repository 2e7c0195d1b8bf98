"""The family registry (``prompts.families``): every family the config accepts has one entry,
and the entry is what the builder uses."""

from __future__ import annotations

from typing import get_args

from cua_native.prompts import dialect_for
from cua_native.prompts.config import VARIANTS, Family, default_prompt_config
from cua_native.prompts.families import FAMILIES, family_of


def test_every_family_has_one_entry() -> None:
    assert set(FAMILIES) == set(get_args(Family)) == set(VARIANTS)
    assert all(entry.name == name for name, entry in FAMILIES.items())


def test_each_family_writes_history_in_its_own_dialect() -> None:
    dialects = {name: dialect_for(default_prompt_config(name)) for name in FAMILIES}
    assert len({type(d) for d in dialects.values()}) == len(FAMILIES)
    for name, dialect in dialects.items():
        config = default_prompt_config(name)
        assert type(family_of(config).dialect(config)) is type(dialect)
