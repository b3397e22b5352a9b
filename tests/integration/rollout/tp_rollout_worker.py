"""Body of one rank of the TP=2 rollout test (run under torch.multiprocessing spawn)."""

import os

import torch


def run_rank(rank: int, world_size: int, port: int, model_dir: str, prompts, sampling, result_path: str) -> None:
    """Joins a gloo world, builds a TP engine inside it, writes this rank's outputs to result_path.<rank>."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    engine = VLLMRolloutEngine(
        model_dir, VLLMEngineOptions(tensor_parallel_size=world_size, dtype="float32", max_model_len=256)
    )
    try:
        out = engine.generate(prompts, sampling)
        torch.save(
            {
                "tp_rank": engine.tp_rank,
                "tp_size": engine.tp_size,
                "responses": out.batch["responses"],
                "rollout_log_probs": out.batch["rollout_log_probs"],
            },
            f"{result_path}.{rank}",
        )
    finally:
        engine.shutdown()  # vLLM's in-process shutdown also destroys the default process group
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
