"""Parameter names as the real servers know them, mapped back to the served model's own.

AReaL's FSDP actor renames a Qwen-VL model's parameters for the server it broadcasts to
(``FSDPEngine._get_model_name_parameters``, AReaL 1.0.4), because SGLang's and vLLM's model
classes lay the modules out differently from transformers':

========================================  ==================================  =====================================
transformers (the stand-in's model)        SGLang                              vLLM
========================================  ==================================  =====================================
``model.language_model.X``                 ``model.X``                         ``language_model.model.X``
``model.visual.X``                         ``visual.X``                        ``visual.X``
``lm_head.X``                              ``lm_head.X``                       ``language_model.lm_head.X``
========================================  ==================================  =====================================

Models that are not Qwen-VL keep their names. ``own_names`` maps every spelling back, so the
stand-in accepts what the real server of the same API would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def sglang_name(name: str) -> str:
    """The SGLang spelling of a transformers Qwen-VL parameter name."""
    renamed = name.replace("language_model.", "", 1)
    if renamed.startswith("model.visual."):
        renamed = renamed.replace("model.", "", 1)
    return renamed


def vllm_name(name: str) -> str:
    """The vLLM spelling of a transformers Qwen-VL parameter name."""
    renamed = name.replace("model.", "", 1)
    if renamed.startswith("language_model."):
        return renamed.replace("language_model.", "language_model.model.", 1)
    if renamed.startswith("lm_head."):
        return f"language_model.{renamed}"
    return renamed


def own_names(model_names: Iterable[str], sent: Sequence[str]) -> list[str]:
    """``sent`` (names in any server's spelling) as the model's own names.

    Raises ``ValueError`` naming up to five that match no parameter in any spelling, and when a
    spelling is ambiguous (two parameters share it); the model is then left untouched.
    """
    own = list(model_names)
    table: dict[str, str] = {name: name for name in own}
    clashes: set[str] = set()
    for name in own:
        for alias in (sglang_name(name), vllm_name(name)):
            if table.get(alias) == name:
                continue
            if alias in table:
                clashes.add(alias)
            else:
                table[alias] = name
    unknown = [name for name in sent if name not in table]
    if unknown:
        raise ValueError(f"weight update names unknown to the model: {unknown[:5]}")
    ambiguous = [name for name in sent if name in clashes and name not in own]
    if ambiguous:
        raise ValueError(f"weight update names match two parameters: {ambiguous[:5]}")
    return [table[name] for name in sent]
