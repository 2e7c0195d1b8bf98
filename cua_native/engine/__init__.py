"""In-process transformers inference engine speaking AReaL's ``InferenceEngine.agenerate``."""

from cua_native.engine.inprocess import InProcessEngine, InProcessEngineConfig
from cua_native.engine.sampling import SampledToken, SamplingParams, sample_token

__all__ = [
    "InProcessEngine",
    "InProcessEngineConfig",
    "SampledToken",
    "SamplingParams",
    "sample_token",
]
