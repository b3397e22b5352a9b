"""TeacherWorker: a teacher model's top-k log-probs on the student's samples, as a role of the hybrid group.

    spec = RoleSpec(TeacherWorker, kwargs={"model_path": path, "config": config.distillation, ...})
    group.role("teacher").init_model()
    topk = group.role("teacher").compute_teacher_topk(batch)   # teacher_topk_ids / teacher_topk_log_probs

The teacher is an in-process vLLM engine (verl_like/rollout/vllm_scoring.py) living in the same process as the
rank's actor and rollout engine (colocated). It must share the policy's tokenizer: it scores the student's token
ids as they are (checked before any worker starts, `check_same_tokenizer`).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from verl_like.config.distillation import DistillationConfig
from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, Worker, register

logger = logging.getLogger(__name__)


class TeacherWorker(Worker):
    """One rank's teacher: model_path (a local HF directory), the `distillation` node, the engine's max_model_len
    (prompt + response) and seed."""

    def __init__(self, model_path: str, config: DistillationConfig, max_model_len: int, seed: int = 0) -> None:
        self.model_path = str(model_path)
        self.config = config
        self.max_model_len = max_model_len
        self.seed = seed
        self.scorer = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Joins the group's process group and builds the teacher's vLLM engine."""
        from verl_like.rollout.vllm_scoring import TeacherEngineOptions, VLLMTopKScorer

        self.init_distributed()
        teacher = self.config.teacher
        options = TeacherEngineOptions(
            top_k=self.config.top_k, dtype=teacher.dtype, gpu_memory_utilization=teacher.gpu_memory_utilization,
            max_model_len=self.max_model_len, trust_remote_code=teacher.trust_remote_code, seed=self.seed,
        )
        self.scorer = VLLMTopKScorer(self.model_path, options)
        logger.info("teacher rank %d: vLLM engine for %s ready", self.rank, self.model_path)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_topk(self, data: DataProto) -> DataProto:
        """"teacher_topk_ids" and "teacher_topk_log_probs" `(batch, response_len, top_k)` of this rank's rows;
        meta_info["metrics"]["timing_s/teacher_rank_max"]: the slowest rank's scoring time."""
        if self.scorer is None:
            raise RuntimeError("TeacherWorker.compute_teacher_topk: call init_model() on the group first")
        start = time.perf_counter()
        out = self.scorer.topk(data)
        slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.meta_info["metrics"] = {"timing_s/teacher_rank_max": float(slowest)}
        return out
