"""On the lent GPU machine only (``bench/gpu/gpu_rehearsal.py`` puts this folder on PYTHONPATH):
every Python process, the subprocesses AReaL starts included, gets stub modules for heavy
optional imports the image lacks (ray, wandb, ...), which AReaL imports but a local run never
calls."""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUB = {
    "ray",
    "boto3",
    "botocore",
    "av",
    "redis",
    "hiredis",
    "wandb",
    "swanlab",
    "trackio",
    "tensorboardX",
    "s3transfer",
}


class _Any(type):
    def __getattr__(cls, name):
        return _Dummy


class _Dummy(metaclass=_Any):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Dummy()

    def __getattr__(self, name):
        return _Dummy()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Dummy


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in STUB and not _installed(top):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _installed(top):
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None and find(top, None) is not None:
            return True
    return False


sys.meta_path.insert(0, _Finder())
