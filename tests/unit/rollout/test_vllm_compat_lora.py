"""vllm_compat's LoRA helpers that absorb release differences (0.25.1 on GPU, 0.32 here), on stand-ins."""

import pytest
import torch

from verl_like.rollout import vllm_compat


class _Mapper:
    def __init__(self, *methods: str) -> None:
        for name in methods:
            setattr(self, name, lambda name=name: f"{name}()")


class _Model:
    def __init__(self, mapper) -> None:
        self.hf_to_vllm_mapper = mapper


@pytest.mark.parametrize(("mapper", "expected"), [
    (None, None),
    (_Mapper("get_rename_mapper"), "get_rename_mapper()"),  # 0.32
    (_Mapper("get_unstacked_mapper"), "get_unstacked_mapper()"),  # 0.25
])
def test_the_adapter_loader_gets_the_mapper_without_stacked_maps(mapper, expected):
    assert vllm_compat.lora_weights_mapper(_Model(mapper)) == expected


def test_lora_wrappers_are_removed_while_weights_load_and_put_back():
    pytest.importorskip("vllm")
    from vllm.lora.layers import BaseLayerWithLoRA

    class Wrapper(BaseLayerWithLoRA, torch.nn.Module):
        def __init__(self, base: torch.nn.Module) -> None:
            torch.nn.Module.__init__(self)
            self.base_layer = base

    base = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(torch.nn.Sequential(Wrapper(base)), torch.nn.Linear(2, 2))
    wrapper = model[0][0]
    with vllm_compat._lora_wrappers_removed(model):
        assert model[0][0] is base
        model.load_state_dict({"0.0.weight": torch.ones(2, 2), "0.0.bias": torch.zeros(2),
                               "1.weight": torch.ones(2, 2), "1.bias": torch.zeros(2)})
    assert model[0][0] is wrapper and torch.equal(wrapper.base_layer.weight, torch.ones(2, 2))


def _wrapped_model():
    from vllm.lora.layers import BaseLayerWithLoRA

    class Wrapper(BaseLayerWithLoRA, torch.nn.Module):
        def __init__(self, base: torch.nn.Module) -> None:
            torch.nn.Module.__init__(self)
            self.base_layer = base

    model = torch.nn.Sequential(Wrapper(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2))
    return model, model[0]


class _Reload:
    """Stands in for a weight-transfer engine's layerwise reload: records the tree it saw at start and finish."""

    def __init__(self, model, fail_finish: bool = False) -> None:
        self.model, self.fail_finish, self.seen = model, fail_finish, []

    def start_weight_update(self) -> None:
        self.seen.append(("start", type(self.model[0]).__name__))

    def finish_weight_update(self) -> None:
        self.seen.append(("finish", type(self.model[0]).__name__))
        if self.fail_finish:
            raise RuntimeError("reload failed")


@pytest.mark.parametrize("fail_finish", [False, True])
def test_server_engines_update_through_the_base_layers_and_put_the_wrappers_back(fail_finish):
    """rollout/server_extension.py: a LoRA server's full-weight round loads HF names into the wrapped layers (0.25.1
    does not resolve them through the wrappers); the wrappers come back even when the reload failed."""
    pytest.importorskip("vllm")
    from verl_like.rollout.server_extension import _LoadsIntoBaseLayers

    class Engine(_LoadsIntoBaseLayers, _Reload):
        pass

    model, wrapper = _wrapped_model()
    engine = Engine(model, fail_finish)
    engine.start_weight_update()
    assert model[0] is wrapper.base_layer
    if fail_finish:
        with pytest.raises(RuntimeError, match="reload failed"):
            engine.finish_weight_update()
    else:
        engine.finish_weight_update()
    assert model[0] is wrapper
    assert engine.seen == [("start", "Linear"), ("finish", "Linear")]


def test_an_update_that_never_finished_keeps_its_wrappers_for_the_next_finish():
    pytest.importorskip("vllm")
    from verl_like.rollout.server_extension import _LoadsIntoBaseLayers

    class Engine(_LoadsIntoBaseLayers, _Reload):
        pass

    model, wrapper = _wrapped_model()
    engine = Engine(model)
    engine.start_weight_update()  # a bucket failed: vLLM never calls finish for this update
    engine.start_weight_update()  # the next sync
    engine.finish_weight_update()
    assert model[0] is wrapper
