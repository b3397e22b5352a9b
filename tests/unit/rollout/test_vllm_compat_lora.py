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
