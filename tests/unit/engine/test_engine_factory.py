"""build_engine: the strategy picks the engine; megatron without megatron-core fails naming what to do."""

from __future__ import annotations

import builtins
import sys

import pytest

from verl_like.config.megatron import MegatronConfig
from verl_like.engine import factory, fsdp
from verl_like.engine.config import EngineConfig

CONFIG = EngineConfig(model_path="/model")


class _Recorder:
    def __init__(self, *args):
        self.args = args


def test_fsdp2_builds_the_fsdp_engine_with_the_config(monkeypatch):
    monkeypatch.setattr(fsdp, "FSDPEngine", _Recorder)
    engine = factory.build_engine(CONFIG, "fsdp2", MegatronConfig(tensor_model_parallel_size=2))
    assert isinstance(engine, _Recorder) and engine.args == (CONFIG,)  # fsdp2 ignores the megatron node


def test_megatron_builds_the_megatron_engine_with_its_layout(monkeypatch):
    module = type(sys)("verl_like.engine.megatron.engine")
    module.MegatronEngine = _Recorder
    monkeypatch.setitem(sys.modules, "verl_like.engine.megatron", type(sys)("verl_like.engine.megatron"))
    monkeypatch.setitem(sys.modules, "verl_like.engine.megatron.engine", module)
    layout = MegatronConfig(pipeline_model_parallel_size=2)
    assert factory.build_engine(CONFIG, "megatron", layout).args == (CONFIG, layout)


def test_megatron_without_megatron_core_names_the_package_and_the_keys(monkeypatch):
    real_import = builtins.__import__

    def no_megatron(name, *args, **kwargs):
        if name.startswith(("megatron", "verl_like.engine.megatron")):
            raise ModuleNotFoundError("No module named 'megatron'", name="megatron")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_megatron)
    with pytest.raises(RuntimeError, match=r"pip install megatron-core.*critic.strategy\) to fsdp2"):
        factory.build_engine(CONFIG, "megatron", MegatronConfig())


@pytest.mark.parametrize("strategy, megatron, message", [
    ("fsdp", None, "strategy='fsdp' is not one of"),
    ("megatron", None, "needs the role's MegatronConfig"),
])
def test_unknown_strategies_and_a_missing_layout_are_refused(strategy, megatron, message):
    with pytest.raises(ValueError, match=message):
        factory.build_engine(CONFIG, strategy, megatron)
