"""Request parsing and answer details shared by the SGLang and vLLM routes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal.api.cli_args import GenerationHyperparameters
from fastapi import Request

from cua_native.engine.serve.core import RequestError

if TYPE_CHECKING:
    from cua_native.engine.serve.core import ServedModel


async def read_json(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object (an empty body is ``{}`` when ``empty_ok``)."""
    raw = await request.body()
    if not raw.strip():
        if empty_ok:
            return {}
        raise RequestError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def token_ids(value: Any, name: str) -> list[int]:
    """One flat list of non-negative token ids (batches are not served)."""
    if not isinstance(value, list) or not value:
        raise RequestError(f"{name} must be a non-empty list of token ids")
    if isinstance(value[0], list):
        raise RequestError(f"{name}: send one request per call (batched input is not served)")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise RequestError(f"{name} must hold non-negative integers only")
    return list(value)


def image_list(value: Any) -> list[str]:
    """SGLang ``image_data``: nothing, one image or a list; base64 strings or data URIs."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise RequestError("image_data entries must be base64 strings or data: URIs")
        if item.startswith(("http://", "https://", "file:")) or item.startswith("/"):
            raise RequestError(
                "image_data holds a URL or path; the stand-in server takes images inline "
                "(base64 or data: URIs), as AReaL sends them"
            )
        out.append(item)
    return out


@dataclass(frozen=True, slots=True)
class FinishDetail:
    matched: int | str | None
    """The stop token id or stop string that ended generation; None for EOS-free ends."""


def finish_detail(
    stop_reason: str,
    tokens: list[int],
    text: str,
    gconfig: GenerationHyperparameters,
    served: ServedModel,
) -> FinishDetail:
    """Which stop condition ended a ``stop``: the last token if it is a stop/EOS id, else the
    stop string found in the text."""
    if stop_reason != "stop" or not tokens:
        return FinishDetail(matched=None)
    last = tokens[-1]
    if last in gconfig.stop_token_ids or last in served.engine.eos_token_ids:
        return FinishDetail(matched=last)
    for stop in gconfig.stop or ():
        if stop in text:
            return FinishDetail(matched=stop)
    return FinishDetail(matched=last)
