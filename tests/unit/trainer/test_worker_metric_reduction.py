"""How the driver turns each worker's metrics into one value per key (trainer/metrics.mean_metrics)."""

from verl_like.protocol import DataProto
from verl_like.trainer.metrics import mean_metrics


def test_memory_metrics_take_the_largest_worker_and_the_rest_the_mean():
    merged = DataProto.concat([
        DataProto(meta_info={"metrics": {"actor/pg_loss": 1.0, "perf/max_memory_allocated_gb": 10.0,
                                         "perf/critic/cpu_memory_used_gb": 2.0}}),
        DataProto(meta_info={"metrics": {"actor/pg_loss": 3.0, "perf/max_memory_allocated_gb": 14.0,
                                         "perf/critic/cpu_memory_used_gb": 1.0}}),
    ])
    assert mean_metrics(merged) == {"actor/pg_loss": 2.0, "perf/max_memory_allocated_gb": 14.0,
                                    "perf/critic/cpu_memory_used_gb": 2.0}
    assert mean_metrics([{"perf/throughput": 4.0}, {"perf/throughput": 6.0}]) == {"perf/throughput": 5.0}
