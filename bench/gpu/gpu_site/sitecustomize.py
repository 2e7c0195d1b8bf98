"""On the lent GPU machine only (``bench/gpu/gpu_rehearsal.py`` puts this folder on PYTHONPATH):
every Python process, the subprocesses AReaL starts included, gets stub modules for heavy
optional imports the image lacks (ray, wandb, ...), which AReaL imports but a local run never
calls."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
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


# ---------------------------------------------------------------------------- RPC timing
# With CUA_RPC_TIMING_DIR set (``gpu_rehearsal.py --rpc-timing``), every process appends one
# JSON line per call of the functions below to DIR/<pid>.jsonl: the controller's RPC round
# trip per actor method, and inside the workers the actor's methods, the engine's model work
# and AReaL's tensor transport (RTensor fetch, JSON/base64 (de)serialisation).
TIMED = {
    "areal.infra.controller.train_controller": [("TrainController", "_custom_function_call")],
    "areal.trainer.ppo.actor": [
        ("PPOActor", "compute_logp"),
        ("PPOActor", "ppo_update"),
        ("PPOActor", "compute_advantages"),
    ],
    "areal.engine.fsdp_engine": [("FSDPEngine", "train_batch"), ("FSDPEngine", "forward_batch")],
    "areal.infra.rpc.rtensor": [("RTensor", "localize"), ("HttpRTensorBackend", "fetch")],
    "areal.infra.rpc.serialization": [(None, "serialize_value"), (None, "deserialize_value")],
}


def _timed(fn, label, path):
    import functools
    import json
    import os
    import time

    depth = [0]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        outer = depth[0] == 0  # recursive (de)serialisation: time the outermost call only
        depth[0] += 1
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if outer:
                method = (
                    args[1] if label.endswith("_custom_function_call") and len(args) > 1 else None
                )
                line = {
                    "label": label,
                    "method": method,
                    "start": start,
                    "dur": time.time() - start,
                }
                with open(os.path.join(path, f"{os.getpid()}.jsonl"), "a") as out:
                    out.write(json.dumps(line) + "\n")

    return call


class _TimingFinder(importlib.abc.MetaPathFinder):
    """Wraps the ``TIMED`` functions right after their module runs."""

    def __init__(self, path):
        self.path = path

    def find_spec(self, name, path, target=None):
        if name not in TIMED:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                run, folder = spec.loader.exec_module, self.path

                def exec_module(module, run=run, folder=folder):
                    run(module)
                    for owner, attr in TIMED[name]:
                        holder = module if owner is None else getattr(module, owner, None)
                        fn = getattr(holder, attr, None) if holder is not None else None
                        if fn is None:
                            continue
                        wrapped = _timed(fn, f"{owner or name.rsplit('.', 1)[-1]}.{attr}", folder)
                        if owner is not None and isinstance(
                            holder.__dict__.get(attr), staticmethod
                        ):
                            wrapped = staticmethod(wrapped)
                        setattr(holder, attr, wrapped)

                spec.loader.exec_module = exec_module
                return spec
        return None


if os.environ.get("CUA_RPC_TIMING_DIR"):
    sys.meta_path.insert(0, _TimingFinder(os.environ["CUA_RPC_TIMING_DIR"]))
