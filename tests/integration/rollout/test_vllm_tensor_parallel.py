"""TP=2 rollout: two processes in a gloo world run vLLM's external_launcher executor and match HF greedy."""

import socket

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("vllm")

from rollout_helpers import forward_log_probs  # noqa: E402
from tp_rollout_worker import run_rank  # noqa: E402

from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.hf import HFRolloutEngine  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tp2_greedy_tokens_and_log_probs_match_hf(tiny_model_dir, hf_model, prompt_batch, tmp_path):
    sampling = SamplingConfig(do_sample=False, max_tokens=12)
    result_path = str(tmp_path / "rank")
    mp.spawn(
        run_rank,
        args=(2, free_port(), str(tiny_model_dir), prompt_batch, sampling, result_path),
        nprocs=2,
        join=True,
    )
    results = [torch.load(f"{result_path}.{rank}") for rank in range(2)]
    reference = HFRolloutEngine(hf_model).generate(prompt_batch, sampling)
    assert [r["tp_rank"] for r in results] == [0, 1] and all(r["tp_size"] == 2 for r in results)
    for result in results:
        assert torch.equal(result["responses"], reference.batch["responses"])
        scored = forward_log_probs(hf_model, reference, sampling)
        assert (result["rollout_log_probs"] - scored).abs().mean() <= 1e-3
