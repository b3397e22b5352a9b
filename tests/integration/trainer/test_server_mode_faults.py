"""Server-mode runs under the conditions of issue #32's hang, run as a user runs them (real Hydra, Ray, FSDP2 and the
session's vLLM server through `server.address`).

Validation after every step of an asynchronous run sends the whole held-out set at once (256 requests, more than
an HTTP client keeps alive) right after the training batches' requests, while, with partial rollout, the next
batches are still generating: every run finishes, validates at every step, trains each batch at the lag its
staleness allows, and no request needed a retry. Partial rollout at staleness 1 and 2 here, and staleness 2
without it (the driver then drains every batch before the sync, so validation meets no request in flight);
staleness 1 without partial rollout is the staleness-1 run of test_server_mode_run.py (validated at steps 5 and
10, also checked for retries).
"""

from __future__ import annotations

import pytest
from test_main_ppo import _run
from test_server_mode_run import SERVER

from verl_like.utils.tracking import read_metrics

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def cache_dir(verl_like_cache):
    from pathlib import Path

    return Path(verl_like_cache)


@pytest.mark.parametrize(("staleness", "partial"), [(1, True), (2, True), (2, False)])
def test_validating_during_an_async_run_finishes_every_step(cache_dir, tmp_path, vllm_server, staleness, partial):
    _run(["+trainer=ci_smoke", *SERVER, f"actor_rollout_ref.rollout.server.address=[{vllm_server}]",
          "async_training.enable=true", f"async_training.staleness={staleness}",
          f"async_training.partial_rollout={str(partial).lower()}", "algorithm.rollout_is=true",
          "trainer.total_training_steps=3", "trainer.test_freq=1", "data.val_batch_size=null",
          "actor_rollout_ref.rollout.server.request_timeout_s=60", f"trainer.default_local_dir={tmp_path}"],
         cache_dir, timeout=300)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(0.0 <= r["val/score/mean"] <= 1.0 for r in records)  # validated after every step
    # step s trains the batch launched at version max(0, s-1-K): its lag is min(s-1, K)
    assert [r["async/staleness"] for r in records] == [float(min(s - 1, staleness)) for s in (1, 2, 3)]
    assert all(r["rollout/requests_retried"] == 0.0 for r in records)
