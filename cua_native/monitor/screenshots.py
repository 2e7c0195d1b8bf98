"""Content-addressed screenshot files under the run directory.

A screenshot is written once to ``<run_dir>/screenshots/<sha256[:2]>/<sha256>.<ext>``; the
``obs`` row keeps that path relative to the run dir, or the URL the gym gave.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from pathlib import Path

SCREENSHOT_DIR = "screenshots"
_DATA_URI = re.compile(r"^data:image/(png|jpeg|jpg|webp);base64,(.*)$", re.DOTALL)
_EXTENSIONS = {"png": "png", "jpeg": "jpg", "jpg": "jpg", "webp": "webp"}
MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".webp": "image/webp"}


class ScreenshotError(ValueError):
    """Bad screenshot data or a path outside the screenshot store."""


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def is_data_uri(uri: str) -> bool:
    return uri.startswith("data:")


def data_uri(image: bytes, media_type: str = "image/png") -> str:
    """Encode image bytes as a ``data:`` URI (how screenshots travel in an ingest batch)."""
    return f"data:{media_type};base64,{base64.b64encode(image).decode('ascii')}"


class ScreenshotStore:
    """Screenshot files of one run directory."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.root = self.run_dir / SCREENSHOT_DIR

    def put(self, image: bytes, ext: str = "png") -> str:
        """Store ``image`` (encoded bytes) once; return its path relative to the run dir."""
        if not image:
            raise ScreenshotError("empty screenshot")
        digest = hashlib.sha256(image).hexdigest()
        relative = f"{SCREENSHOT_DIR}/{digest[:2]}/{digest}.{ext}"
        target = self.run_dir / relative
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.part")
            partial.write_bytes(image)
            os.replace(partial, target)
        return relative

    def put_data_uri(self, uri: str) -> str:
        match = _DATA_URI.match(uri)
        if match is None:
            raise ScreenshotError("screenshot data URI must be data:image/<png|jpeg|webp>;base64,…")
        try:
            image = base64.b64decode(match.group(2), validate=True)
        except binascii.Error as exc:
            raise ScreenshotError(f"screenshot data URI is not valid base64: {exc}") from exc
        return self.put(image, _EXTENSIONS[match.group(1)])

    def resolve(self, relative: str) -> Path:
        """The file for a stored relative path; refuses anything outside the screenshot dir."""
        candidate = (self.run_dir / relative).resolve()
        if not candidate.is_relative_to(self.root) or candidate.suffix not in MEDIA_TYPES:
            raise ScreenshotError(f"not a stored screenshot: {relative!r}")
        if not candidate.is_file():
            raise ScreenshotError(f"screenshot not found: {relative!r}")
        return candidate
