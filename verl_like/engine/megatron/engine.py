"""MegatronEngine: a TrainEngine on megatron-core (tensor, pipeline and data parallelism), local layer spec.

World = TP x PP x DP over the default process group. Every TP/PP peer of a data-parallel rank gets the same rows;
the last pipeline stage computes the outputs and losses and broadcasts them to its stage peers, so every rank of a
DP rank returns the same results. Gradients are summed over micro-batches and DP ranks, never averaged: Megatron
runs in per-token-loss mode (no division by the number of micro-batches, DDP scale 1) and its per-token scaling
is skipped (`compat.finalize_grads`), so the loss contract of verl_like.engine.base holds as with FSDP.

Departures from the FSDP engine, one line each:
- use_remove_padding cuts the micro-batch's all-padding columns instead of packing (megatron-core's local
  attention has no packed path without TransformerEngine; see outputs.py).
- teacher top-k log-probs ("topk_log_probs") are not computed.
- gradient_checkpointing and offload_policy are refused (recompute forks the CUDA RNG; offload_policy is FSDP2's).
- master weights stay float32 (dtype "bfloat16" is refused); param_dtype "bfloat16" computes in bf16 through
  Megatron's Float16Module and mixed-precision optimizer, on CUDA only (its type checks want CUDA tensors).
- model_kind "sequence_classifier" is refused (reward models stay on FSDP); so is megatron.sequence_parallel
  (the local spec's torch norm does not support it).
- weight decay applies to every parameter, as AdamW over all parameters in the FSDP engine (Megatron's default
  exempts biases and norms).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from verl_like.config.megatron import MegatronConfig
from verl_like.engine.base import ForwardBackwardResult, LossFn, TrainEngine, WeightHoldings
from verl_like.engine.config import EngineConfig, MicroBatching
from verl_like.engine.lr_schedule import WarmupSchedule
from verl_like.engine.megatron import compat, cpu_support
from verl_like.engine.megatron.checkpoint import load_megatron_checkpoint, save_megatron_checkpoint
from verl_like.engine.megatron.memory import move_optimizer_state, move_params
from verl_like.engine.megatron.convert import hf_to_megatron, model_shape, rope_theta, transformer_config
from verl_like.engine.megatron.outputs import causal_lm_outputs, model_inputs, padded_to, value_outputs
from verl_like.engine.megatron.parallel import ensure_model_parallel
from verl_like.engine.megatron.weights import MegatronWeights
from verl_like.engine.micro_batches import checked_loss, engine_inputs, engine_micro_batches, loss_micro_batches
from verl_like.engine.model_loading import load_model
from verl_like.engine.shared import init_process_group_from_env, require_onloaded, require_optimizer
from verl_like.protocol import DataProto
from verl_like.utils.device import get_torch_device, is_cuda_available

logger = logging.getLogger(__name__)



class ValueHead(nn.Linear):
    """Linear(hidden, 1) in the place of GPTModel's output layer (called like it: returns (output, bias))."""

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
        return super().forward(hidden), None


class MegatronEngine(TrainEngine):
    """Trains one HF Qwen2/Llama model as Megatron-core GPTModel chunks over the whole default process group."""

    def __init__(self, config: EngineConfig, parallel: MegatronConfig, prefix: str = "megatron") -> None:
        if config.model_kind == "sequence_classifier":
            raise ValueError(
                "MegatronEngine does not train model_kind='sequence_classifier'; reward models stay on FSDP (set the "
                "reward model's strategy to fsdp2)"
            )
        if config.dtype != "float32" or config.param_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(
                f"MegatronEngine keeps float32 master weights (EngineConfig.dtype={config.dtype!r}, param_dtype="
                f"{config.param_dtype!r}); set dtype='float32' and param_dtype None or 'bfloat16'"
            )
        # bf16 compute with float32 master weights: Megatron's Float16Module and mixed-precision optimizer, whose
        # type checks want CUDA tensors.
        self.bf16 = config.param_dtype == "bfloat16"
        if self.bf16 and not is_cuda_available():
            raise ValueError(
                "MegatronEngine computes in bfloat16 only on CUDA (Megatron's mixed-precision optimizer checks for "
                "CUDA tensors); on CPU set param_dtype=None (float32)"
            )
        for key in ("gradient_checkpointing", "offload_policy"):
            if getattr(config, key):
                raise ValueError(
                    f"MegatronEngine does not support EngineConfig.{key}=True yet (Megatron's activation recompute "
                    "forks the CUDA RNG, and offload_policy is FSDP2's); set it to False"
                )
        if parallel.sequence_parallel:
            raise ValueError(
                f"{prefix}.sequence_parallel=true needs TransformerEngine's or apex's layer norms; the local layer "
                "spec's torch norm refuses it (megatron-core 0.16.1); set it to false"
            )
        compat.check_version()
        init_process_group_from_env()
        self.config = config
        self.parallel = parallel
        self.on_cpu = not is_cuda_available()
        self.device = get_torch_device()
        if self.on_cpu:
            cpu_support.apply_cpu_shims()
        ensure_model_parallel(parallel, prefix)
        from megatron.core import parallel_state as ps

        self._ps = ps
        hf_model = load_model(config)
        self.hf_config = hf_model.config
        self.hf_class = type(hf_model)
        self.shape = model_shape(hf_model.config, value_head=config.model_kind == "value")
        parallel.check_model(prefix, self.shape.num_hidden_layers, self.shape.num_key_value_heads)
        self.tp, self.pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
        self.vpp = parallel.virtual_pipeline_model_parallel_size
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        if self.on_cpu:
            cpu_support.seed_model_parallel_rng(parallel.seed, self.tp_rank)
        else:
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(parallel.seed)
        with cpu_support.cpu_mode(self.on_cpu):
            self.tf_config = transformer_config(self.hf_config, self.shape, parallel,
                                                torch.bfloat16 if self.bf16 else torch.float32)
            self.chunks = self._build_chunks(hf_model.state_dict())
        hf_params = [(name, tuple(p.shape)) for name, p in hf_model.named_parameters()]
        del hf_model
        self.weights = MegatronWeights(self, hf_params)
        self.optimizer = None if config.inference_only else self._build_optimizer()
        self.schedule = WarmupSchedule(config.lr_scheduler, config.warmup_steps, config.total_steps,
                                       config.min_lr_ratio)
        self._global_step = 0
        self._params_offloaded = False
        self._optimizer_offloaded = False

    # ---------------------------------------------------------------- construction

    def _build_chunks(self, hf_state: dict[str, torch.Tensor]) -> list[nn.Module]:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.models.gpt import GPTModel

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=self._distributed_optimizer,
        )
        chunks = []
        for vp_stage in range(self.vpp or 1):
            extra = {"vp_stage": vp_stage} if self.vpp else {}
            pre = self._ps.is_pipeline_first_stage(ignore_virtual=False, **extra)
            post = self._ps.is_pipeline_last_stage(ignore_virtual=False, **extra)
            model = GPTModel(
                config=self.tf_config,
                transformer_layer_spec=compat.local_layer_spec(),
                vocab_size=self.shape.padded_vocab(self.tp),
                max_sequence_length=self.hf_config.max_position_embeddings,
                pre_process=pre,
                post_process=post,
                parallel_output=False,  # logits gathered over TP (outputs.causal_lm_outputs)
                share_embeddings_and_output_weights=self.shape.tie_word_embeddings,
                position_embedding_type="rope",
                rotary_base=rope_theta(self.hf_config),
                **extra,
            )
            if post and self.shape.value_head:
                model.output_layer = ValueHead(self.shape.hidden_size, 1)
            self._load(model, hf_to_megatron(self.shape, hf_state, self.tp_rank, self.tp, self.pp_rank, self.pp,
                                             self.vpp, vp_stage))
            model.to(self.device)
            if self.bf16:
                from megatron.core.transformer.module import Float16Module

                model = Float16Module(self.tf_config, model)  # bf16 compute; float32 logits out of the last stage
            chunks.append(DistributedDataParallel(
                config=self.tf_config, ddp_config=ddp_config, module=model, disable_bucketing=vp_stage > 0))
        return chunks

    @staticmethod
    def _load(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        params = dict(model.named_parameters())
        if set(params) != set(state):
            raise RuntimeError(
                f"Megatron/HF conversion mismatch: parameters without HF weights {sorted(set(params) - set(state))}, "
                f"converted weights without a parameter {sorted(set(state) - set(params))}"
            )
        with torch.no_grad():
            for name, param in params.items():
                if param.shape != state[name].shape:
                    raise RuntimeError(f"{name}: Megatron shape {tuple(param.shape)} != converted "
                                       f"{tuple(state[name].shape)}")
                param.copy_(state[name])

    @property
    def _distributed_optimizer(self) -> bool:
        flag = self.parallel.use_distributed_optimizer
        return bool(flag)  # null: off, until the distributed optimizer's state can be checkpointed

    def _build_optimizer(self):
        cfg = self.config
        optimizer_config = compat.optimizer_config(
            optimizer="adam", lr=cfg.lr, min_lr=0.0, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
            adam_beta2=cfg.betas[1], adam_eps=cfg.eps, clip_grad=0.0,  # clipping is done in optimizer_step
            use_distributed_optimizer=self._distributed_optimizer, bf16=self.bf16,
            params_dtype=torch.bfloat16 if self.bf16 else torch.float32,
        )
        with cpu_support.cpu_mode(self.on_cpu):
            optimizer = compat.build_optimizer(optimizer_config, self.chunks, use_gloo_groups=self.on_cpu)
        # Megatron exempts biases and norms from weight decay; EngineConfig means AdamW over all parameters.
        for group in optimizer.param_groups:
            group["weight_decay"] = cfg.weight_decay
        return optimizer

    # ---------------------------------------------------------------- groups

    @property
    def dp_rank(self) -> int:
        return self._ps.get_data_parallel_rank()

    @property
    def dp_size(self) -> int:
        return self._ps.get_data_parallel_world_size()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self._ps.get_data_parallel_group()

    @property
    def collects_outputs(self) -> bool:
        return self.tp_rank == 0 and self.pp_rank == self.pp - 1

    @property
    def global_step(self) -> int:
        return self._global_step

    @property
    def current_lr(self) -> float:
        self._require_optimizer("current_lr")
        return self.config.lr * self.schedule(self._global_step)

    def _require_onloaded(self, op: str) -> None:
        require_onloaded(self._params_offloaded, "MegatronEngine", op)

    def _require_optimizer(self, op: str) -> Any:
        return require_optimizer(self.optimizer, "MegatronEngine", op)

    # ---------------------------------------------------------------- forward / backward

    def _model_inputs(self, batch: DataProto) -> DataProto:
        return engine_inputs(batch, self.config.model_kind, "MegatronEngine")  # sequence_classifier refused at build

    @property
    def micro_batch_multiple(self) -> int:
        # megatron-core's interleaved schedule refuses a micro-batch count that is not a multiple of the pipeline
        # size (microbatch_group_size_per_vp_stage, by default the pipeline size)
        return self.pp if self.vpp else 1

    def _micro_batches(self, batch: DataProto, micro_batching: MicroBatching | None = None) -> list[list[int]]:
        return engine_micro_batches(batch, micro_batching or self.config.micro_batching, self.dp_group,
                                    multiple=self.micro_batch_multiple)

    def _outputs(self, output: torch.Tensor, micro_batch: DataProto, inputs, temperature: float,
                 calculate_entropy: bool) -> dict[str, torch.Tensor]:
        if self.shape.value_head:
            return value_outputs(output, micro_batch.batch, inputs.column_offset)
        return causal_lm_outputs(output, micro_batch.batch, inputs.column_offset, self.shape.vocab_size,
                                 temperature, calculate_entropy)

    def _run_schedule(self, micro_batches: list[DataProto], loss_func, forward_only: bool) -> None:
        """Runs Megatron's schedule over `micro_batches`; `loss_func(micro_batch, inputs, output)` runs on the
        last stage and returns the loss tensor to back-propagate."""
        prepared = [(mb, model_inputs(mb.batch, self.config.use_remove_padding)) for mb in micro_batches]
        longest = max(inputs.input_ids.shape[1] for _, inputs in prepared)
        widest = max(inputs.input_ids.shape[0] for _, inputs in prepared)
        if self.vpp:  # the interleaved schedule needs one micro-batch shape (convert.transformer_config)
            prepared = [(mb, padded_to(inputs, widest, longest)) for mb, inputs in prepared]

        def forward_step(data_iterator, model):
            micro_batch, inputs = next(data_iterator)
            output = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                           attention_mask=inputs.attention_mask)

            def wrapped(output_tensor):
                rows = micro_batch.batch.batch_size[0]
                loss = loss_func(micro_batch, inputs, output_tensor[:rows])
                # (loss, token count, reported): per-token-loss mode, the count only feeds skipped scaling.
                return loss, torch.ones((), dtype=torch.int, device=loss.device), {}

            return output, wrapped

        data = [iter(prepared) for _ in self.chunks] if self.vpp else iter(prepared)
        with cpu_support.cpu_mode(self.on_cpu):
            compat.forward_backward_func()(
                forward_step_func=forward_step, data_iterator=data,
                model=self.chunks if self.vpp else self.chunks[0], num_microbatches=len(prepared),
                seq_length=longest, micro_batch_size=widest, forward_only=forward_only,
            )

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the last pipeline stage holds it, on every stage (same shape and dtype everywhere)."""
        if self.pp == 1:
            return tensor
        moved = tensor.to(self.device)
        dist.broadcast(moved, src=self._ps.get_pipeline_model_parallel_last_rank(),
                       group=self._ps.get_pipeline_model_parallel_group())
        return moved.cpu()

    def _output_keys(self, calculate_entropy: bool) -> list[str]:
        if self.shape.value_head:
            return ["values"]
        return ["log_probs", "entropy"] if calculate_entropy else ["log_probs"]

    def forward(self, batch: DataProto, temperature: float = 1.0, calculate_entropy: bool = False,
                micro_batching: MicroBatching | None = None) -> DataProto:
        """Outputs for every row of this rank's batch, in its row order, as float32 CPU tensors."""
        self._require_onloaded("forward")
        inputs = self._model_inputs(batch)
        groups = self._micro_batches(inputs, micro_batching)
        pieces: dict[str, list[torch.Tensor]] = defaultdict(list)

        def collect(micro_batch, model_in, output):
            outputs = self._outputs(output, micro_batch, model_in, temperature, calculate_entropy)
            for key, value in outputs.items():
                pieces[key].append(value.float().cpu())
            return output.new_zeros(())

        with torch.no_grad():
            self._run_schedule([inputs[indices].to(self.device) for indices in groups], collect, forward_only=True)
        order = torch.tensor([i for indices in groups for i in indices])
        response_len = inputs.batch["responses"].shape[1]
        tensors = {}
        for key in self._output_keys(calculate_entropy):
            local = torch.cat(pieces[key]) if pieces[key] else torch.zeros(len(order), response_len)
            tensors[key] = torch.empty_like(local)
            tensors[key][order] = self._from_last_stage(local)
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": temperature})

    def forward_backward(
        self, batch: DataProto, loss_fn: LossFn, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> ForwardBackwardResult:
        self._require_onloaded("forward_backward")
        self._require_optimizer("forward_backward")
        inputs = self._model_inputs(batch)
        groups = self._micro_batches(inputs)
        micro_batches = list(loss_micro_batches(batch, groups, self.dp_group, temperature, self.device))
        losses: list[float] = []
        metrics: dict[str, list[float]] = defaultdict(list)

        def compute_loss(micro_batch, model_in, output):
            outputs = self._outputs(output, micro_batch, model_in, temperature, calculate_entropy)
            loss, loss_metrics = checked_loss(loss_fn, outputs, micro_batch)
            losses.append(float(loss.detach()))
            for key, value in loss_metrics.items():
                metrics[key].append(float(value))
            return loss

        self._run_schedule(micro_batches, compute_loss, forward_only=False)
        local_losses = self._from_last_stage(torch.tensor(losses or [0.0] * len(groups), dtype=torch.float64))
        if self.pp > 1:
            shared = [dict(metrics)]
            dist.broadcast_object_list(shared, src=self._ps.get_pipeline_model_parallel_last_rank(),
                                       group=self._ps.get_pipeline_model_parallel_group())
            metrics = shared[0]
        total = local_losses.sum().reshape(1).to(self.device)
        dist.all_reduce(total, group=self.dp_group)
        return ForwardBackwardResult(loss=float(total), metrics=dict(metrics), num_micro_batches=len(groups))

    def optimizer_step(self, lr_scale: float = 1.0) -> float:
        self._require_onloaded("optimizer_step")
        optimizer = self._require_optimizer("optimizer_step")
        if not 0.0 < lr_scale <= 1.0:
            raise ValueError(f"MegatronEngine.optimizer_step: lr_scale={lr_scale} must lie in (0, 1]")
        with cpu_support.cpu_mode(self.on_cpu):
            compat.finalize_grads(self.chunks)  # once per step: forward_backward calls accumulate locally
            for group in optimizer.param_groups:
                group["lr"] = self.current_lr * lr_scale
            optimizer.prepare_grads()
            grad_norm = float(optimizer.get_grad_norm())
            if not torch.isfinite(torch.tensor(grad_norm)):
                logger.warning("step %d: gradient norm is %s; skipping the update", self._global_step, grad_norm)
            else:
                if self.config.grad_clip is not None:
                    # Megatron's clip_grad_by_total_norm_fp32 asserts CUDA tensors; same formula, any device.
                    coefficient = self.config.grad_clip / (grad_norm + 1e-6)
                    if coefficient < 1.0:
                        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
                            for param in inner.get_parameters():
                                if param.grad is not None:
                                    param.grad.mul_(coefficient)
                optimizer.step_with_ready_grads()
            optimizer.zero_grad()
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
        self._global_step += 1
        return grad_norm

    # ---------------------------------------------------------------- weights

    def weight_holdings(self) -> WeightHoldings:
        return self.weights.holdings()

    def local_weight_shards(self) -> dict[str, torch.Tensor]:
        return self.weights.local_shards()

    def full_state_iterator(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.weights.full_state()

    def save_checkpoint(self, directory: str | Path) -> None:
        self._require_onloaded("save_checkpoint")
        self._require_optimizer("save_checkpoint")
        save_megatron_checkpoint(self, directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        self._require_onloaded("load_checkpoint")
        self._require_optimizer("load_checkpoint")
        self._global_step = load_megatron_checkpoint(self, directory)

    def export_hf(self, directory: str | Path, tokenizer: Any | None = None) -> None:
        self._require_onloaded("export_hf")
        self.weights.export_hf(directory, tokenizer)

    def offload(self) -> None:
        """Moves parameters / optimizer state to CPU per param_offload / optimizer_offload (no-op moves on CPU).

        The DDP gradient buffers stay where they are (they are zero between steps; their main_grad views would
        have to be rebuilt after a move).
        """
        if self.config.param_offload and not self._params_offloaded:
            move_params(self.chunks, torch.device("cpu"))
            self._params_offloaded = True
        if self.config.optimizer_offload and not self._optimizer_offloaded and self.optimizer is not None:
            move_optimizer_state(self.optimizer, torch.device("cpu"))
            self._optimizer_offloaded = True
        if is_cuda_available():
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self._params_offloaded:
            move_params(self.chunks, self.device)
            self._params_offloaded = False
        if self._optimizer_offloaded:
            move_optimizer_state(self.optimizer, self.device)
            self._optimizer_offloaded = False
