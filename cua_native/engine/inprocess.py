"""In-process transformers engine speaking AReaL's ``InferenceEngine.agenerate``.

One worker thread owns the model. ``agenerate`` prepares inputs off the event loop, queues
a job and awaits its future. Two decoders (``InProcessEngineConfig.decoder``):

* ``slots`` (Qwen3 / Qwen3-VL text stacks, the default where supported): continuous
  batching. Queued jobs join the running batch at the next step boundary while fewer than
  ``max_batch_size`` rows run; they are prefilled in left-padded groups of at most
  ``prefill_tokens`` padded tokens, their keys/values copied into fixed-shape slots
  (``kv_arena.py``), and every decode step runs all rows at once (``text_step.py``: a
  CUDA graph per batch bucket on CUDA). Rows leave as soon as they stop. Queued jobs are
  admitted only while the arena fits ``kv_cache_gib`` (first come, first served), and the
  waiting rows are prefilled shortest first.
* ``legacy`` (any model): static batching. Up to ``max_batch_size`` queued jobs are
  prefilled as one batch and decoded together over transformers' ``DynamicCache`` until
  each stops; jobs that arrive meanwhile wait for the next batch.

Both decoders take Qwen3-VL images' encoder outputs from a cache keyed by image content
(``vision_cache.py``), so a screenshot shown by several prompts is encoded once.

Weight updates, version changes and pauses are applied by the worker between two forward
passes, so they never overlap one. After a weight update the running rows are re-prefilled
(prompt + tokens so far) under the new weights, so every token's logprob is exactly the one
the weights of its ``output_versions`` entry give for its prefix.

Sampling is deterministic for a fixed engine seed and call order: each request gets its own
CPU ``torch.Generator`` seeded from ``(seed, request counter)`` (or ``metadata["seed"]``),
so batching and scheduling do not change results. See ``sampling.py`` for the logprob
definition.

Remote-only parts of AReaL's interface (servers, NCCL weight groups, the workflow executor's
``submit``/``wait``/``prepare_batch``) raise ``TypeError`` saying so.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from areal.api.engine_api import InferenceEngine
from areal.api.io_struct import ModelRequest, ModelResponse, WeightUpdateMeta
from transformers import PreTrainedModel

from cua_native.engine.batch import BatchDecoder, RowInput
from cua_native.engine.inputs import PreparedInput, VisionSpec, prepare_input
from cua_native.engine.overlap import InFlightStep
from cua_native.engine.sampling import (
    LOGPROB_MODES,
    SampledToken,
    SamplingParams,
    batchable,
    launch_sample_rows,
    sample_rows,
)
from cua_native.engine.slots import SlotDecoder
from cua_native.engine.text_step import unsupported_reason
from cua_native.engine.vision_cache import CachedVisionForward, VisionCache
from cua_native.engine.weights import (
    NamedTensors,
    check_named_tensors,
    copy_into,
    load_checkpoint_state,
)

StopReason = Literal["length", "stop", "abort"]
DecoderKind = Literal["auto", "slots", "legacy"]


@dataclass(frozen=True, slots=True)
class InProcessEngineConfig:
    device: str = "cpu"
    seed: int = 0
    max_batch_size: int = 8
    logprob_mode: Literal["full", "truncated"] = "full"
    """``full``: ``log_softmax(logits/T)`` (what the trainer recomputes); ``truncated``: under
    the renormalised top-k/top-p distribution actually sampled from."""
    abort_on_pause: bool = False
    """``pause_generation`` ends running requests with ``stop_reason="abort"`` (SGLang's raw
    behaviour) instead of holding them until ``continue_generation`` (AReaL's agenerate)."""
    join_timeout_s: float = 30.0
    decoder: DecoderKind = "auto"
    """``slots``: continuous batching over a slot KV cache (Qwen3 / Qwen3-VL text stacks);
    ``legacy``: static batches over transformers' ``DynamicCache`` (any model); ``auto``:
    ``slots`` where the model is supported (see the module docstring)."""
    cuda_graphs: bool = True
    """Replay decode steps as CUDA graphs (``slots`` decoder on CUDA only)."""
    decode_compile: bool = True
    """With CUDA graphs: fuse the decode step's elementwise work with ``torch.compile``
    (``decode_ops.py``; the first step of each batch bucket compiles, seconds)."""
    kv_block: int = 256
    """Slot capacity grows in multiples of this many tokens (``slots`` decoder)."""
    prefill_tokens: int = 16384
    """Most padded tokens one prefill forward takes (``slots`` decoder; one row at least)."""
    decode_attention: Literal["auto", "flash", "matmul"] = "auto"
    """Attention of the ``slots`` decode step (``text_step.py``): ``auto`` is ``flash`` on
    CUDA in bf16/fp16, else ``matmul``."""
    kv_cache_gib: float | None = None
    """Most GiB the ``slots`` decoder's KV arena may hold: queued requests join only while
    the arena, sized for every admitted row's prompt + ``max_new_tokens``, stays within it
    (first come, first served; one row always runs). ``None``: on CUDA, 75 % of the memory
    free when the worker starts (the rest for the prefill's activations and the vision
    cache); no limit on CPU."""
    overlap_decode: bool | None = None
    """Launch each decode step before reading the previous step's tokens (``slots``
    decoder, while every row samples without top-k/top-p; ``overlap.py``): the host's
    read-back and bookkeeping run while the device computes, with the same results.
    ``None``: on CUDA (on CPU the steps run synchronously, so nothing overlaps)."""
    stack_projections: bool | None = None
    """Run each layer's query/key/value and gate/up projections as one product each in the
    ``slots`` decode step (``stacked_weights.py``: a stacked copy of those weights, about
    45 % of a Qwen3 text stack's, refreshed after every weight update). ``None``: on CUDA,
    where small matrix products read their weights far below the memory's speed."""
    vision_cache_mb: int = 2048
    """Most MiB of vision-encoder outputs kept by image content (``vision_cache.py``; Qwen3-VL
    shaped models), so a screenshot shown by several prompts is encoded once; 0: off."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if self.decoder not in ("auto", "slots", "legacy"):
            raise ValueError("decoder must be one of auto, slots, legacy")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be > 0")
        if self.vision_cache_mb < 0:
            raise ValueError("vision_cache_mb must be >= 0")
        if self.kv_block < 1 or self.prefill_tokens < 1:
            raise ValueError("kv_block and prefill_tokens must be >= 1")
        if self.logprob_mode not in LOGPROB_MODES:
            raise ValueError(f"logprob_mode must be one of {LOGPROB_MODES}")


@dataclass(eq=False)
class _Job:
    prepared: PreparedInput
    params: SamplingParams
    generator: torch.Generator
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[_Job]
    tokenizer: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stop_reason: StopReason | None = None
    error: BaseException | None = None
    cancelled: bool = False
    needs_prefill: bool = True

    def row(self) -> RowInput:
        return RowInput(
            ids=self.prepared.input_ids + self.tokens,
            mm=self.prepared.mm,
            image_keys=self.prepared.image_keys,
        )


@dataclass(eq=False)
class _Op:
    """Work the worker runs between two forward passes."""

    fn: Callable[[], None]
    future: Future[None]
    invalidates_cache: bool


def _resolve(job: _Job) -> None:
    if not job.future.done():
        job.future.set_result(job)


def _deliver(job: _Job) -> None:
    try:
        job.loop.call_soon_threadsafe(_resolve, job)
    except RuntimeError:  # the caller's event loop is closed: nobody is waiting
        pass


class InProcessEngine(InferenceEngine):
    """A transformers model served in this process through ``agenerate``."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: Any = None,
        tokenizer: Any = None,
        config: InProcessEngineConfig | None = None,
    ) -> None:
        self.config = config or InProcessEngineConfig()
        self.device = torch.device(self.config.device)
        # transformers wraps `to` in functools.wraps, which mypy reads as an unbound function.
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.processor = processor
        self.tokenizer = tokenizer or getattr(processor, "tokenizer", None)
        self._vision = VisionSpec.from_config(model.config)
        self._eos_ids = self._find_eos_ids()
        self._pad_id = self._find_pad_id()
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        self._never_sample = frozenset(
            t for t in (self._vision.image_token_id, self._vision.video_token_id) if t is not None
        )
        self._cond = threading.Condition()
        self._pending: deque[_Job] = deque()
        self._ops: deque[_Op] = deque()
        self._counter = itertools.count()
        self._version = 0
        self._gen_paused = False
        self._admission_paused = False
        self._abort_running = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._running_rows = 0
        self.decoder_kind = self._pick_decoder()
        self._overlap = self._on_cuda_unless(self.config.overlap_decode)
        self._inflight: InFlightStep[_Job] | None = None  # the worker's own
        self.vision_cache = (
            VisionCache(self.config.vision_cache_mb * 2**20)
            if self.config.vision_cache_mb > 0 and CachedVisionForward.supports(self.model)
            else None
        )
        """Encoded images by content (``None``: off or not a Qwen3-VL-shaped model); the
        worker's own, read its counters only while no request runs."""
        self._hashing: ThreadPoolExecutor | None = None  # image keys' chunks, while running

    def _on_cuda_unless(self, setting: bool | None) -> bool:
        """A switch that is ``None`` (the default) is on where the engine runs on CUDA."""
        return self.device.type == "cuda" if setting is None else setting

    def _pick_decoder(self) -> Literal["slots", "legacy"]:
        reason = unsupported_reason(self.model)
        if self.config.decoder == "slots" and reason is not None:
            raise ValueError(f"decoder='slots' is not available for this model: {reason}")
        if self.config.decoder == "legacy" or reason is not None:
            return "legacy"
        return "slots"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        max_batch_size: int = 8,
        **config: Any,
    ) -> InProcessEngine:
        """Load model and processor from a Hugging Face directory and start the worker."""
        from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        try:
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
            processor = AutoProcessor.from_pretrained(path)
            tokenizer = getattr(processor, "tokenizer", None)
        except ValueError:  # a text-only causal LM
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            processor = None
            tokenizer = AutoTokenizer.from_pretrained(path)
        cfg = InProcessEngineConfig(
            device=device, seed=seed, max_batch_size=max_batch_size, **config
        )
        engine = cls(model, processor, tokenizer, cfg)
        engine.initialize()
        return engine

    def _find_eos_ids(self) -> frozenset[int]:
        found: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None:
            eos = getattr(self.model.config.get_text_config(), "eos_token_id", None)
        if isinstance(eos, int):
            found.add(eos)
        elif eos is not None:
            found.update(int(e) for e in eos)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            found.add(int(self.tokenizer.eos_token_id))
        return frozenset(found)

    def _find_pad_id(self) -> int:
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        pad = getattr(self.model.config.get_text_config(), "pad_token_id", None)
        return int(pad) if pad is not None else min(self._eos_ids, default=0)

    # ------------------------------------------------------------------ lifecycle
    def initialize(self, *args: Any, **kwargs: Any) -> None:
        """Start the worker thread (idempotent). Arguments are accepted and ignored."""
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            if self.vision_cache is not None:
                self._hashing = ThreadPoolExecutor(
                    min(8, os.cpu_count() or 1), thread_name_prefix="image-keys"
                )
            self._thread = threading.Thread(
                target=self._worker, name="inprocess-engine", daemon=True
            )
            self._thread.start()

    @property
    def initialized(self) -> bool:
        return self._thread is not None and not self._stopping

    @property
    def running_rows(self) -> int:
        """How many requests the worker held after its last forward pass."""
        return self._running_rows

    @property
    def queued(self) -> int:
        """How many requests wait for admission."""
        with self._cond:
            return len(self._pending)

    @property
    def failure(self) -> BaseException | None:
        """What killed the worker thread, if it died (requests then fail with it)."""
        return self._failure

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation unless ``gconfig.ignore_eos`` (model and tokenizer EOS)."""
        return self._eos_ids

    def destroy(self) -> None:
        """Stop the worker; queued and running requests end with ``stop_reason="abort"``."""
        with self._cond:
            thread, self._stopping = self._thread, True
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.join_timeout_s)
        with self._cond:
            self._thread = None
            hashing, self._hashing = self._hashing, None
        if hashing is not None:
            hashing.shutdown(wait=False)

    def __enter__(self) -> InProcessEngine:
        self.initialize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ------------------------------------------------------------------ versions / pauses
    def set_version(self, version: int) -> None:
        with self._cond:
            self._version = int(version)

    def get_version(self) -> int:
        with self._cond:
            return self._version

    def pause_generation(self) -> None:
        """Hold running requests at the next step boundary (or abort them, see config)."""
        with self._cond:
            self._gen_paused = True
            self._cond.notify_all()

    def continue_generation(self) -> None:
        with self._cond:
            self._gen_paused = False
            self._cond.notify_all()

    def abort_requests(self) -> None:
        """End every queued and running request with ``stop_reason="abort"``; non-blocking.

        Queued requests end at once with no tokens; running ones at the next step boundary with
        the tokens, logprobs and versions generated so far (SGLang's and vLLM's abort on
        pause). Requests submitted afterwards are not affected: call ``pause_generation``
        first to hold new work while aborting.
        """
        with self._cond:
            queued = list(self._pending)
            self._pending.clear()
            self._abort_running = True
            self._cond.notify_all()
        self._finish(queued, "abort")

    def pause(self) -> None:
        """Stop starting new requests; running ones finish. Queued ones wait for ``resume``."""
        with self._cond:
            self._admission_paused = True

    def resume(self) -> None:
        with self._cond:
            self._admission_paused = False
            self._cond.notify_all()

    # ------------------------------------------------------------------ generation
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one sample for ``req``; see the module docstring for the guarantees."""
        start = time.perf_counter()
        if not self.initialized:
            raise RuntimeError("InProcessEngine is not running: call initialize() first.")
        if self._failure is not None:
            raise RuntimeError("InProcessEngine worker died") from self._failure
        params = SamplingParams.from_gconfig(
            req.gconfig,
            len(req.input_ids),
            self._eos_ids,
            self._vocab,
            never_sample=self._never_sample,
        )
        if params.stop_strings and (req.tokenizer or self.tokenizer) is None:
            raise ValueError("gconfig.stop (stop strings) needs a tokenizer to decode outputs.")
        counter = next(self._counter)  # taken before any await: call order fixes the seed
        seed = req.metadata.get("seed") if req.metadata else None
        generator = torch.Generator(device="cpu")
        generator.manual_seed(
            int(seed) if seed is not None else (self.config.seed * 1_000_003 + counter) % 2**63
        )
        prepared = await asyncio.to_thread(
            prepare_input, req, self._vision, self.vision_cache is not None, self._hashing
        )
        loop = asyncio.get_running_loop()
        job = _Job(
            prepared=prepared,
            params=params,
            generator=generator,
            loop=loop,
            future=loop.create_future(),
            tokenizer=req.tokenizer or self.tokenizer,
        )
        with self._cond:
            if self._stopping or self._thread is None:
                raise RuntimeError("InProcessEngine was destroyed.")
            if self._failure is not None:
                raise RuntimeError("InProcessEngine worker died") from self._failure
            self._pending.append(job)
            self._cond.notify_all()
        try:
            await job.future
        except asyncio.CancelledError:
            with self._cond:
                job.cancelled = True
                if job in self._pending:
                    self._pending.remove(job)
                self._cond.notify_all()
            raise
        if job.error is not None:
            raise RuntimeError(f"generation failed: {job.error!r}") from job.error
        return self._response(req, job, start)

    def _response(self, req: ModelRequest, job: _Job, start: float) -> ModelResponse:
        times = job.times
        return ModelResponse(
            input_tokens=list(job.prepared.input_ids),
            output_tokens=list(job.tokens),
            output_logprobs=list(job.logprobs),
            output_versions=list(job.versions),
            stop_reason=job.stop_reason or "abort",
            tokenizer=req.tokenizer,
            input_images=list(req.image_data or []),
            processor=req.processor,
            latency=time.perf_counter() - start,
            ttft=(times[0] - start) if times else float("inf"),
            itl=[b - a for a, b in itertools.pairwise(times)],
        )

    # ------------------------------------------------------------------ weight updates
    def _submit_op(self, fn: Callable[[], None], invalidates_cache: bool) -> Future[None]:
        future: Future[None] = Future()
        op = _Op(fn=fn, future=future, invalidates_cache=invalidates_cache)
        with self._cond:
            running = self._thread is not None and not self._stopping
            if running:
                self._ops.append(op)
                self._cond.notify_all()
        if not running:  # no worker, hence no forward pass to race with
            self._run_op(op)
        return future

    @staticmethod
    def _run_op(op: _Op) -> None:
        if not op.future.set_running_or_notify_cancel():
            return
        try:
            op.fn()
        except BaseException as exc:
            op.future.set_exception(exc)
        else:
            op.future.set_result(None)

    def update_weights_from_state_dict(
        self, state_dict: NamedTensors, version: int | None = None
    ) -> Future[None]:
        """Copy ``state_dict`` (full or partial) into the model between two forward passes.

        Names and shapes are checked first (``ValueError``, model untouched). The version is
        set to ``version`` when given. Returns a future: ``.result()`` from sync code,
        ``await asyncio.wrap_future(f)`` from async code.
        """
        items = check_named_tensors(self.model, state_dict)

        def apply() -> None:
            copy_into(self.model, items)
            if self.vision_cache is not None:  # the vision tower may have changed
                self.vision_cache.clear()
            if version is not None:
                self.set_version(version)

        return self._submit_op(apply, invalidates_cache=True)

    update_weights_from_tensor = update_weights_from_state_dict

    def update_weights_from_disk(
        self, meta: WeightUpdateMeta | str | os.PathLike[str], version: int | None = None
    ) -> Future[None]:
        """Load a ``save_pretrained`` directory (path or AReaL ``WeightUpdateMeta(type="disk")``).

        The checkpoint is read on a helper thread; only the copy waits for a step boundary.
        The version becomes ``version``, else ``meta.version``, else stays (AReaL then calls
        ``set_version``). Unlike AReaL's remote engines this loads at once: call it after the
        checkpoint is fully written.
        """
        if isinstance(meta, WeightUpdateMeta):
            if meta.type != "disk" or meta.path is None:
                raise TypeError(
                    f"in-process engine loads type='disk' updates with a path, got {meta.type!r}"
                )
            if meta.use_lora:
                raise TypeError("LoRA weight updates are not supported by the in-process engine.")
            path: str | os.PathLike[str] = meta.path
            version = version if version is not None else meta.version
        else:
            path = meta
        result: Future[None] = Future()
        result.set_running_or_notify_cancel()

        def load() -> None:
            try:
                state = load_checkpoint_state(self.model, Path(path))
                inner = self.update_weights_from_state_dict(state, version)
            except BaseException as exc:
                result.set_exception(exc)
                return
            inner.add_done_callback(lambda f: _chain(f, result))

        threading.Thread(target=load, name="inprocess-engine-load", daemon=True).start()
        return result

    # ------------------------------------------------------------------ worker
    def _take_work(
        self, active: list[_Job], fits: Callable[[int, int], bool] | None = None
    ) -> tuple[_Op | None, list[_Job], bool]:
        """Block until there is something to do; returns (op, new jobs, stop). ``fits(rows,
        horizon)``: whether the KV memory holds that many rows that long (admission stops
        at the first queued job that would not fit: first come, first served)."""
        with self._cond:
            while True:
                if self._stopping:
                    return None, [], True
                if self._ops:
                    return self._ops.popleft(), [], False
                if self._abort_running and not active:
                    self._abort_running = False  # nothing was running: nothing to abort
                if active and self._abort_running:
                    return None, [], False
                room = self.config.max_batch_size - len(active)
                if (
                    active
                    and self.decoder_kind == "slots"
                    and room > 0
                    and self._pending
                    and not (self._gen_paused or self._admission_paused)
                ):
                    size = self._admissible(active, min(room, len(self._pending)), fits)
                    if size:
                        return None, [self._pending.popleft() for _ in range(size)], False
                if active and any(j.cancelled for j in active):
                    return None, [], False
                if active and self._gen_paused and self.config.abort_on_pause:
                    return None, [], False
                if active and not self._gen_paused:
                    return None, [], False
                if (
                    not active
                    and self._pending
                    and not (self._gen_paused or self._admission_paused)
                ):
                    size = min(self.config.max_batch_size, len(self._pending))
                    size = max(1, self._admissible(active, size, fits))  # one row at least
                    return None, [self._pending.popleft() for _ in range(size)], False
                self._cond.wait()

    def _admissible(
        self, active: list[_Job], most: int, fits: Callable[[int, int], bool] | None
    ) -> int:
        """How many of the first ``most`` queued jobs can join ``active`` within the KV
        budget (called with the lock held)."""
        if fits is None:
            return most
        horizon = max((self._horizon_of(job) for job in active), default=0)
        for taken in range(most):
            horizon = max(horizon, self._horizon_of(self._pending[taken]))
            if not fits(len(active) + taken + 1, horizon):
                return taken
        return most

    @staticmethod
    def _horizon_of(job: _Job) -> int:
        return len(job.prepared.input_ids) + job.params.max_new_tokens

    def _new_decoder(self) -> BatchDecoder | SlotDecoder:
        if self.decoder_kind == "legacy":
            return BatchDecoder(self.model, self.device, self._pad_id, self.vision_cache)
        return SlotDecoder(
            self.model,
            self.device,
            self._pad_id,
            self.config.kv_block,
            self.config.cuda_graphs,
            self.config.decode_attention,
            self.config.decode_compile,
            self.vision_cache,
            None if self.config.kv_cache_gib is None else int(self.config.kv_cache_gib * 2**30),
            self._on_cuda_unless(self.config.stack_projections),
        )

    def _worker(self) -> None:
        active: list[_Job] = []
        try:
            decoder = self._new_decoder()
            with torch.inference_mode():
                while True:
                    if self._gen_paused:  # deliver what the step in flight finished first
                        active = self._drain(decoder, active)
                    op, new_jobs, stop = self._take_work(
                        active, decoder.fits if isinstance(decoder, SlotDecoder) else None
                    )
                    if stop:
                        break
                    if (
                        op is not None
                        or new_jobs
                        or self._abort_running
                        or self._gen_paused
                        or any(j.cancelled for j in active)
                    ):  # anything but the next step: read the step in flight first
                        active = self._drain(decoder, active)
                    if op is not None:
                        self._run_op(op)
                        if op.invalidates_cache:
                            if isinstance(decoder, SlotDecoder):
                                decoder.weights_changed()
                            for job in active:
                                job.needs_prefill = True
                        continue
                    active = active + new_jobs
                    if self._take_abort() or (self._gen_paused and self.config.abort_on_pause):
                        self._finish(self._drain(decoder, active), "abort")
                        active = []
                        decoder.reset()
                        continue
                    kept = [i for i, j in enumerate(active) if not j.cancelled]
                    if len(kept) != len(active):
                        active = self._retain(decoder, active, kept)
                    if not active:
                        decoder.reset()
                        continue
                    if self._gen_paused:  # woken for a cancellation: keep holding
                        continue
                    if isinstance(decoder, SlotDecoder):
                        active = self._advance_slots(decoder, active)
                    else:
                        active = self._advance(decoder, active)
                    self._running_rows = len(active)
        except BaseException as exc:
            self._failure = exc
            for job in active:
                job.error = exc
                _deliver(job)
        finally:
            self._finish(active, "abort")
            with self._cond:
                pending = list(self._pending)
                self._pending.clear()
                ops = list(self._ops)
                self._ops.clear()
            self._finish(pending, "abort")
            for op in ops:  # nothing runs on the model any more: apply them inline
                self._run_op(op)

    def _take_abort(self) -> bool:
        with self._cond:
            requested, self._abort_running = self._abort_running, False
            return requested

    @staticmethod
    def _retain(
        decoder: BatchDecoder | SlotDecoder, active: list[_Job], kept: list[int]
    ) -> list[_Job]:
        """Drop the rows not in ``kept`` from ``active`` and the decoder, in step."""
        if isinstance(decoder, SlotDecoder):
            return [active[i] for i in decoder.retain(kept, len(active))]
        if not any(job.needs_prefill for job in active):
            decoder.keep(kept)
        return [active[i] for i in kept]

    def _advance(self, decoder: BatchDecoder, active: list[_Job]) -> list[_Job]:
        """Static batching: one forward pass and one token per row; the rows still running."""
        version = self.get_version()
        if any(job.needs_prefill for job in active):
            logits = decoder.prefill([job.row() for job in active])
            for job in active:
                job.needs_prefill = False
        else:
            logits = decoder.step([job.tokens[-1] for job in active])
        still = self._sample(active, list(range(len(active))), logits, version)
        decoder.keep(still)
        return [active[i] for i in still]

    def _advance_slots(self, decoder: SlotDecoder, active: list[_Job]) -> list[_Job]:
        """Continuous batching: prefill one group of waiting rows, or step every row."""
        if self._overlap and all(not job.needs_prefill and batchable(job.params) for job in active):
            return self._overlapped_step(decoder, active)
        active = self._drain(decoder, active)
        version = self.get_version()
        # shortest first: the median row's first token comes sooner, the total is the same
        waiting = sorted(
            (i for i, job in enumerate(active) if job.needs_prefill),
            key=lambda i: len(active[i].prepared.input_ids) + len(active[i].tokens),
        )
        if waiting:
            group: list[int] = []
            for i in waiting:
                width = max([len(active[i].row().ids)] + [len(active[g].row().ids) for g in group])
                if group and width * (len(group) + 1) > self.config.prefill_tokens:
                    break
                group.append(i)
            logits = decoder.fill(
                [active[i].row() for i in group],
                group,
                len(active),
                need=max(len(job.prepared.input_ids) + len(job.tokens) for job in active) + 1,
                horizon=self._horizon(active),
            )
            for i in group:
                active[i].needs_prefill = False
        else:
            group = list(range(len(active)))
            logits = decoder.step([job.tokens[-1] for job in active], self._horizon(active))
        finished = set(group) - set(self._sample(active, group, logits, version))
        if not finished:
            return active
        return self._retain(decoder, active, [i for i in range(len(active)) if i not in finished])

    def _overlapped_step(self, decoder: SlotDecoder, active: list[_Job]) -> list[_Job]:
        """Launch a step for every row on the tokens of the step in flight (or, after a
        prefill, the host's), then read the step in flight (``overlap.py``)."""
        previous = self._inflight
        tokens = [job.tokens[-1] for job in active] if previous is None else previous.next_tokens()
        unread = 0 if previous is None else 1
        logits = decoder.step(tokens, self._horizon(active))
        sample = launch_sample_rows(
            logits,
            [job.params for job in active],
            [len(job.tokens) + unread for job in active],
            [self._uniform(job) for job in active],
        )
        self._inflight = InFlightStep(list(active), sample, self.get_version())
        if previous is None:
            return active
        return self._apply(decoder, active, previous)

    def _drain(self, decoder: BatchDecoder | SlotDecoder, active: list[_Job]) -> list[_Job]:
        """Read the step in flight, if any: its rows get their tokens, stopped rows leave."""
        inflight, self._inflight = self._inflight, None
        if inflight is None or not isinstance(decoder, SlotDecoder):
            return active
        return self._apply(decoder, active, inflight)

    def _apply(
        self, decoder: SlotDecoder, active: list[_Job], step: InFlightStep[_Job]
    ) -> list[_Job]:
        """Give ``step``'s rows their tokens (rows that stopped before it drop theirs) and
        remove the rows that stop from ``active`` and the decoder (and the step now in
        flight follows the new order)."""
        now = time.perf_counter()
        for job, token in step.read():
            if job.stop_reason is None:
                self._take_token(job, token, step.version, now)
        kept = [i for i, job in enumerate(active) if job.stop_reason is None]
        if len(kept) == len(active):
            return active
        order = decoder.retain(kept, len(active))
        if self._inflight is not None:
            if order:
                self._inflight.follow(order)
            else:  # no row runs on: the step in flight has nothing to give
                self._inflight = None
        return [active[i] for i in order]

    @staticmethod
    def _uniform(job: _Job) -> float:
        """The row's next random draw (one per step, from its own generator)."""
        return float(torch.rand((), generator=job.generator, dtype=torch.float64))

    @staticmethod
    def _horizon(active: list[_Job]) -> int:
        """The most positions any running row can reach (prompt + max_new_tokens)."""
        return max(len(job.prepared.input_ids) + job.params.max_new_tokens for job in active)

    def _sample(
        self, active: list[_Job], rows: list[int], logits: torch.Tensor, version: int
    ) -> list[int]:
        """Sample one token for each of ``active[rows]`` (``logits`` row ``j`` is
        ``rows[j]``), finish the rows that stop; returns the rows still running."""
        uniforms = [self._uniform(active[i]) for i in rows]
        picked: list[SampledToken] = sample_rows(
            logits,
            [active[i].params for i in rows],
            [len(active[i].tokens) for i in rows],
            uniforms,
        )
        now = time.perf_counter()
        return [
            i
            for i, token in zip(rows, picked, strict=True)
            if self._take_token(active[i], token, version, now)
        ]

    def _take_token(self, job: _Job, token: SampledToken, version: int, now: float) -> bool:
        """Append ``token`` to ``job``; finish the job if it stops. Whether it runs on."""
        truncated = self.config.logprob_mode == "truncated"
        job.tokens.append(token.token)
        job.logprobs.append(token.truncated_logprob if truncated else token.logprob)
        job.versions.append(version)
        job.times.append(now)
        reason = self._stop_reason(job)
        if reason is not None:
            self._finish([job], reason)
        return reason is None

    @staticmethod
    def _stop_reason(job: _Job) -> StopReason | None:
        params = job.params
        if job.tokens[-1] in params.stop_token_ids:  # banned until min_new_tokens
            return "stop"
        if params.stop_strings and job.tokenizer is not None:
            text = job.tokenizer.decode(job.tokens)
            if any(s in text for s in params.stop_strings):
                return "stop"
        if len(job.tokens) >= params.max_new_tokens:
            return "length"
        return None

    @staticmethod
    def _finish(jobs: list[_Job], reason: StopReason) -> None:
        for job in jobs:
            if job.stop_reason is None:
                job.stop_reason = reason
            _deliver(job)

    # ------------------------------------------------------------------ remote-only surface
    def _remote_only(self, what: str) -> TypeError:
        return TypeError(
            f"{what} is a remote-engine feature; InProcessEngine serves the model in this "
            "process (use agenerate, update_weights_from_state_dict/_disk, set_version)."
        )

    def launch_server(self, server_args: dict[str, Any]) -> Any:
        raise self._remote_only("launch_server")

    def teardown_server(self) -> None:
        raise self._remote_only("teardown_server")

    def init_weights_update_group(self, meta: WeightUpdateMeta, rank_ids: Any = None) -> Any:
        raise self._remote_only("init_weights_update_group (NCCL)")

    def update_weights_from_distributed(self, meta: WeightUpdateMeta, param_specs: Any) -> Any:
        raise self._remote_only("update_weights_from_distributed (NCCL)")

    def submit(self, *args: Any, **kwargs: Any) -> int:
        raise self._remote_only("submit (AReaL workflow executor)")

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        raise self._remote_only("wait (AReaL workflow executor)")

    def rollout_batch(self, *args: Any, **kwargs: Any) -> Any:
        raise self._remote_only("rollout_batch (AReaL workflow executor)")

    def prepare_batch(self, *args: Any, **kwargs: Any) -> Any:
        raise self._remote_only("prepare_batch (AReaL workflow executor)")


def _chain(source: Future[None], target: Future[None]) -> None:
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(None)
