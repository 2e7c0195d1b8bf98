"""``cua_native`` loggers after AReaL's logging set-up (``cua_native/rollout/logs.py``), with
AReaL's own ``getLogger`` run first."""

from __future__ import annotations

import logging
import sys
import types

import pytest
from areal.utils import logging as areal_logging

from cua_native.rollout import logs


def _module_after_areal(monkeypatch: pytest.MonkeyPatch, name: str) -> logging.Logger:
    """A ``cua_native`` module imported after AReaL's ``getLogger`` swapped logging's manager:
    its module-level logger is created as every module's is."""
    module = types.ModuleType(name)
    log = logging.getLogger(name)
    module.log = log  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    return log


def _without_the_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    """AReaL's own ``getLogger`` for this test, even where an earlier test in the process (any
    that started a ``TrainingMonitor``) installed the seam; restored afterwards."""
    current = areal_logging.getLogger
    monkeypatch.setattr(areal_logging, "getLogger", getattr(current, "__wrapped__", current))


def test_a_module_logger_made_after_areals_getlogger_reaches_the_root(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _without_the_seam(monkeypatch)
    caplog.set_level(logging.WARNING)
    areal_logging.getLogger("areal-first")  # AReaL's set-up: a new root and manager
    log = _module_after_areal(monkeypatch, "cua_native.probe_after_areal")
    areal_logging.getLogger("areal-again")  # and again, with dictConfig over existing loggers
    log.warning("lost before the seam")
    assert "lost before the seam" not in caplog.text  # the failure the seam is for, reproduced
    logs.install()
    log.warning("kept by the seam")
    assert "kept by the seam" in caplog.text
    assert logging.getLogger("cua_native.probe_after_areal") is log
    assert not log.disabled
    areal_logging.getLogger("areal-later")  # AReaL runs its set-up again while training runs
    log.warning("kept after AReaL again")
    assert "kept after AReaL again" in caplog.text
    assert not log.disabled and logging.getLogger("cua_native.probe_after_areal") is log


def test_levels_set_on_a_package_logger_apply_to_its_modules(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _without_the_seam(monkeypatch)
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    areal_logging.getLogger("areal-first")
    log = _module_after_areal(monkeypatch, "cua_native.probe_pkg.inner")
    logs.install()
    log.info("below the root's level")
    caplog.set_level(logging.INFO, logger="cua_native.probe_pkg")
    log.info("an info record")
    assert "an info record" in caplog.text and "below the root's level" not in caplog.text
