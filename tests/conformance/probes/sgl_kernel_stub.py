"""An import stub for ``sgl_kernel`` (SGLang's CUDA kernels) on a machine without a GPU.

``sgl_kernel`` refuses to import without ``libcuda.so.1``, and SGLang imports it at module
level from code the request path never runs (memory pools, attention backends). This stub makes
``import sgl_kernel`` and ``from sgl_kernel.x import f`` succeed; calling anything from it raises,
so a probe that reached a kernel would fail loudly instead of computing something else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: a CUDA kernel was called on the CPU conformance probe")

    def __getattr__(self, item: str) -> _Unavailable:
        return _Unavailable(f"{self._name}.{item}")


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Unavailable(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the stub in front of every other importer (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
