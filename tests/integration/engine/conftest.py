"""Fixtures for the engine tests: tiny models, and one 2-rank gloo run of every engine scenario."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from verl_like.models.tiny import TinyModelSpec, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("engine_models") / "tiny"))


@pytest.fixture(scope="session")
def tied_model_dir(tmp_path_factory) -> str:
    spec = TinyModelSpec(tie_word_embeddings=True, seed=1)
    return str(build_tiny_model(tmp_path_factory.mktemp("engine_models") / "tiny_tied", spec))


@pytest.fixture(scope="session")
def vocab_size(tiny_model_dir) -> int:
    return AutoConfig.from_pretrained(tiny_model_dir).vocab_size


class ScenarioResults:
    """Per-rank results of the 2-rank run; `get` fails the calling test with the scenario's own traceback."""

    def __init__(self, per_rank: list[dict]) -> None:
        self.per_rank = per_rank

    def get(self, name: str) -> list[dict]:
        results = [rank_results[name] for rank_results in self.per_rank]
        for rank, result in enumerate(results):
            if isinstance(result, dict) and "error" in result and len(result) == 1:
                pytest.fail(f"scenario {name!r} failed on rank {rank}:\n{result['error']}")
        return results


@pytest.fixture(scope="session")
def engine_runs(tiny_model_dir, tied_model_dir, vocab_size, tmp_path_factory) -> ScenarioResults:
    from engine_scenarios import run_all_scenarios

    workdir = tmp_path_factory.mktemp("engine_scenarios")
    return ScenarioResults(run_all_scenarios(tiny_model_dir, tied_model_dir, vocab_size, str(workdir)))
