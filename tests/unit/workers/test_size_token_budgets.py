"""ActorRolloutWorker.size_token_budgets hands each sized budget to its pass (engines faked; engine/token_budget.py
does the sizing and has its own tests)."""

from __future__ import annotations

from types import SimpleNamespace

from verl_like.engine import token_budget
from verl_like.workers.actor_rollout import ActorRolloutWorker


class FakeEngine:
    def __init__(self):
        self.budget = None

    def set_token_budget(self, max_tokens):
        self.budget = max_tokens


def _worker(ref_engine):
    actor = SimpleNamespace(engine=FakeEngine())
    ref = None if ref_engine is None else SimpleNamespace(engine=actor.engine if ref_engine == "lora" else ref_engine)
    return SimpleNamespace(actor=actor, ref=ref, _log_prob_budget=None, _require=lambda part, _op: part)


def _sized(monkeypatch, calls):
    def size(passes, engine, ref, longest, timeout_s, role):
        calls.append((list(passes), ref, longest, timeout_s, role))
        return {name: 8192 * (i + 1) for i, name in enumerate(passes)}

    monkeypatch.setattr(token_budget, "size_engine_budgets", size)


def test_each_pass_gets_its_budget_and_the_group_call_names_the_role(monkeypatch):
    calls = []
    _sized(monkeypatch, calls)
    ref_engine = FakeEngine()
    worker = _worker(ref_engine)
    out = ActorRolloutWorker.size_token_budgets(worker, ["update", "log_prob", "ref_log_prob"], 640, 30.0)
    assert out == {"update": 8192, "log_prob": 16384, "ref_log_prob": 24576}
    assert worker.actor.engine.budget == 8192 and worker._log_prob_budget == 16384 and ref_engine.budget == 24576
    assert calls == [(["update", "log_prob", "ref_log_prob"], ref_engine, 640, 30.0,
                      "actor_rollout.size_token_budgets")]


def test_a_reference_sharing_the_actors_engine_is_not_sized_apart(monkeypatch):
    calls = []
    _sized(monkeypatch, calls)
    worker = _worker("lora")
    out = ActorRolloutWorker.size_token_budgets(worker, ["update", "ref_log_prob"], 640, 30.0)
    assert out == {"update": 8192} and calls[0][:2] == (["update"], None)
    assert worker.actor.engine.budget == 8192 and worker._log_prob_budget is None
