"""RewardModelWorker: a learned reward model (a sequence classifier) as a worker-group role.

    spec = RoleSpec(RewardModelWorker, kwargs={"config": config.reward_model})
    group = WorkerGroup(pool, spec, name="rm")
    group.init_model()
    rm = group.compute_rm_score(batch)     # DataProto "rm_scores" (batch, response_len)

The model reads each whole (prompt + response) sequence as the rollout produced it (the same token ids, so the
reward model must share the policy's tokenizer: config/tokenizer_check.py refuses another one before any worker
starts) and its one output at the last valid token is the score. That score sits on the last valid response
token of "rm_scores", zero elsewhere, like the rule scores of verl_like/rewards/manager.py. The trainer runs it
as one more role in each process of the hybrid group (as the critic); on its own group it works the same.
"""

from __future__ import annotations

import logging
import torch

from verl_like.config.reward import RewardModelConfig
from verl_like.engine.base import TrainEngine
from verl_like.engine.factory import build_engine
from verl_like.engine.from_config import reward_model_engine_config
from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, Worker, register

logger = logging.getLogger(__name__)

_MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """`(batch, response_len)` zeros with scores[i] on row i's last valid response token (column 0 if none).

    scores: `(batch,)`; response_mask: `(batch, response_len)`, 0/1 or bool.
    """
    lengths = response_mask.long().sum(-1)
    last = (lengths - 1).clamp(min=0)
    token_level = torch.zeros(response_mask.shape, dtype=torch.float32)
    token_level[torch.arange(len(scores)), last] = scores.float()
    return token_level


class RewardModelWorker(Worker):
    """One rank of the reward-model role.

    config: the frozen `reward_model` node (model.path, micro-batching, FSDP options).
    seed: seeds a score head missing from the checkpoint (then the same on every rank; a trained reward model
      brings its own).
    """

    def __init__(self, config: RewardModelConfig, seed: int = 0) -> None:
        self.config = config
        self.engine_config = reward_model_engine_config(config, seed=seed)
        self._engine: TrainEngine | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Joins the group's process group and builds the FSDP sequence classifier (no optimizer)."""
        self.init_distributed()
        self._engine = build_engine(self.engine_config, self.config.strategy)  # reward_model.strategy: fsdp2 only
        self._engine.offload()  # a no-op unless fsdp_config.param_offload
        logger.info("reward model rank %d: built from %s", self.rank, self.engine_config.model_path)

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """"rm_scores" `(batch, response_len)`: the model's score of each whole sequence on its last response token.

        Reads input_ids, attention_mask, position_ids `(batch, prompt_len + response_len)`, responses and, if
        present, response_mask `(batch, response_len)`. meta_info["metrics"] holds reward_model/score_mean of
        this rank's rows.
        """
        if self._engine is None:
            raise RuntimeError("RewardModelWorker.compute_rm_score: the model is not built; call init_model() first")
        missing = [key for key in _MODEL_KEYS if key not in data.batch.keys()]
        if missing:
            raise KeyError(
                f"RewardModelWorker.compute_rm_score: the batch lacks {missing}; it has {sorted(data.batch.keys())}"
            )
        keys = list(_MODEL_KEYS) + (["response_mask"] if "response_mask" in data.batch.keys() else [])
        rows = data.select(batch_keys=keys, non_tensor_keys=[], meta_keys=[])
        self._engine.onload()
        try:
            scores = self._engine.forward(rows).batch["scores"]
        finally:
            self._engine.offload()
        rm_scores = place_on_last_token(scores, response_mask_of(rows.batch))
        return DataProto.from_dict(tensors={"rm_scores": rm_scores})
