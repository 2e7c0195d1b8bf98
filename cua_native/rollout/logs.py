"""Keep ``cua_native``'s loggers enabled and attached to ``logging.root`` after AReaL sets up
logging.

AReaL 1.0.4's ``areal.utils.logging.getLogger`` (called at import of AReaL's modules and while
its trainer runs) replaces ``logging.Logger.root`` and ``logging.Logger.manager`` with new
objects and runs ``logging.config.dictConfig`` with ``disable_existing_loggers: True``. A
``logging.getLogger(__name__)`` that runs after such a call creates the module's logger in the
new manager, under the new root: its records never reach ``logging.root`` (where handlers,
``basicConfig`` and pytest's ``caplog`` listen), ``logging.getLogger(name)`` later answers
another object than the one the module logs on, and a later ``dictConfig`` may disable it.

``keep_package_loggers`` re-homes every ``cua_native`` logger, wherever it was created: the
module-level loggers of the imported ``cua_native`` modules and those the current manager
holds become one object per name in the current manager, enabled, each under its nearest
``cua_native`` ancestor and the package logger under ``logging.root``. ``install`` does it now
and after every later call of AReaL's ``getLogger`` (by wrapping that function once); the
monitor lifecycle (``TrainingMonitor.start``) calls it, so every training, evaluation and
rehearsal process has it before it records anything.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

PACKAGE = "cua_native"
_WRAPPED = "_cua_native_keeps_loggers"


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def keep_package_loggers() -> None:
    """Re-home every ``cua_native`` logger under ``logging.root``, enabled (see the module)."""
    manager = logging.Logger.manager
    found: dict[str, logging.Logger] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not _ours(name):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, logging.Logger) and _ours(value.name):
                found.setdefault(value.name, value)
    for name, value in list(manager.loggerDict.items()):
        if isinstance(value, logging.Logger) and _ours(name):
            found.setdefault(name, value)
    for name in list(found):  # every ancestor a logger of its own, as logging makes them
        head = name
        while "." in head:
            head = head.rpartition(".")[0]
            if head not in found:
                found[head] = logging.Logger(head)
    found.setdefault(PACKAGE, logging.Logger(PACKAGE))
    for name, logger in found.items():
        manager.loggerDict[name] = logger
        logger.manager = manager
        logger.disabled = False
        head = name.rpartition(".")[0]
        logger.parent = found[head] if head else logging.root
    for logger in found.values():
        logger.setLevel(logger.level)  # clears the effective-level caches of the manager


def install() -> None:
    """``keep_package_loggers`` now, and after every call of AReaL's ``getLogger`` when AReaL
    is imported (idempotent)."""
    keep_package_loggers()
    areal_logging = sys.modules.get("areal.utils.logging")
    if areal_logging is None:
        return
    original = getattr(areal_logging, "getLogger")  # noqa: B009 (a module AReaL ships untyped)
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def get_logger(*args: Any, **kwargs: Any) -> Any:
        logger = original(*args, **kwargs)
        keep_package_loggers()
        return logger

    setattr(get_logger, _WRAPPED, True)
    setattr(areal_logging, "getLogger", get_logger)  # noqa: B010
