"""The stand-in maps the parameter names AReaL broadcasts back to its model's own (issue 12).

The server-side spellings are produced by AReaL's own renaming
(``FSDPEngine._get_model_name_parameters``), run here on the tiny Qwen3-VL.
"""

from __future__ import annotations

from typing import Any

import pytest

from cua_native.engine.serve.param_names import own_names


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_areal_spelling_maps_back_to_every_own_parameter(tiny: Any, sk: Any, backend: str) -> None:
    spelling = sk.areal_spelling(tiny.model, backend)
    own, sent = list(spelling), list(spelling.values())
    assert sent != own  # AReaL does rename a Qwen-VL model for both servers
    assert own_names(tiny.model.state_dict().keys(), sent) == own


def test_own_spelling_is_accepted_as_is(tiny: Any) -> None:
    own = list(tiny.model.state_dict().keys())
    assert own_names(own, own[:3]) == own[:3]


def test_unknown_names_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown to the model: \['visual\.extra'\]"):
        own_names(["model.visual.x", "lm_head.weight"], ["visual.x", "visual.extra"])
