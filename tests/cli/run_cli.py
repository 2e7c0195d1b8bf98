"""Run ``python -m MODULE ARGS...`` for real (``runpy``, as ``-m`` does) and, at exit, write the
heavy modules that were imported to the file named by ``$CLI_IMPORTS_OUT`` (JSON list): a model
cannot have been loaded in a process that never imported torch."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys

HEAVY = ("torch", "transformers", "areal")


def _report() -> None:
    with open(os.environ["CLI_IMPORTS_OUT"], "w", encoding="utf-8") as handle:
        json.dump(sorted(name for name in HEAVY if name in sys.modules), handle)


if __name__ == "__main__":
    atexit.register(_report)
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
