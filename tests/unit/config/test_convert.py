"""The generic mapping -> frozen dataclass converter behind to_typed."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from verl_like.config import ConfigError
from verl_like.config.convert import FrozenDict, build_node, closest_key, freeze, type_name, valid_keys


@dataclass(frozen=True)
class Inner:
    size: int = 1
    ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"inner.size={self.size} must be >= 1")


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    betas: tuple[float, float] = (0.9, 0.99)
    tags: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    flag: bool = False


def test_builds_nested_nodes_and_freezes_containers():
    out = build_node(Outer, {"name": "a", "inner": {"size": 3, "ratio": 1}, "maybe": {"size": 2},
                             "betas": [0.8, 0.9], "tags": ["x", "y"], "extra": {"k": [1, {"j": 2}]}}, "")
    assert out.inner == Inner(size=3, ratio=1.0) and isinstance(out.inner.ratio, float)
    assert out.maybe == Inner(size=2)
    assert out.betas == (0.8, 0.9) and out.tags == ("x", "y")
    assert out.extra == {"k": (1, {"j": 2})} and isinstance(out.extra["k"][1], FrozenDict)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "name is required but not set"),
        ({"name": "a", "inner": {"sise": 2}}, "unknown config key 'inner.sise'; did you mean 'inner.size'?"),
        ({"name": "a", "flag": 1}, "flag=1 has the wrong type: expected bool, got int"),
        ({"name": "a", "inner": {"size": True}}, "inner.size=True has the wrong type: expected int, got bool"),
        ({"name": "a", "inner": {"size": 1.5}}, "inner.size=1.5 has the wrong type: expected int, got float"),
        ({"name": "a", "betas": [0.9]}, "betas=[0.9] must have exactly 2 entries"),
        ({"name": "a", "tags": ["x", 3]}, "tags[1]=3 has the wrong type: expected str"),
        ({"name": "a", "maybe": {"size": 0}}, "maybe: inner.size=0 must be >= 1"),  # the node's own message, pathed
        ({"name": "a", "maybe": 3}, "maybe=3 has the wrong type: expected mapping (Inner node) or null"),
        ({"name": "a", "inner": 5}, "inner=5 has the wrong type: expected mapping (Inner node)"),
        ({"name": "a", "extra": [1]}, "extra=[1] has the wrong type: expected mapping"),
    ],
)
def test_errors_name_the_dotted_key(value, message):
    with pytest.raises(ConfigError) as excinfo:
        build_node(Outer, value, "")
    assert message in str(excinfo.value)


def test_node_errors_get_the_full_path_prefix():
    with pytest.raises(ConfigError, match=r"^root\.inner\.size=0 must be >= 1"):
        build_node(Outer, {"name": "a", "inner": {"size": 0}}, "root")


def test_valid_keys_and_suggestions():
    keys = valid_keys(Outer)
    assert keys[:4] == ["name", "inner", "inner.size", "inner.ratio"]
    assert closest_key("inner.sizes", keys) == "inner.size"
    assert closest_key("ratio", keys) in ("inner.ratio", "maybe.ratio")  # the same name one level down
    assert closest_key("zzz", keys) is None


def test_type_names():
    assert type_name(int | None) == "int or null"
    assert type_name(tuple[str, ...]) == "list of str"
    assert type_name(tuple[float, float]) == "list of 2 (float, float)"


def test_frozen_dict_is_read_only_and_pickles():
    frozen = freeze({"a": [1, 2], "b": {"c": 1}})
    assert frozen == {"a": (1, 2), "b": {"c": 1}}
    for mutate in (lambda d: d.__setitem__("x", 1), lambda d: d.update(x=1), lambda d: d.pop("a"),
                   lambda d: d.clear(), lambda d: d.setdefault("x", 1), lambda d: d.__delitem__("a")):
        with pytest.raises(TypeError, match="read-only"):
            mutate(frozen)
    for restored in (pickle.loads(pickle.dumps(frozen)), copy.deepcopy(frozen)):
        assert restored == frozen and isinstance(restored, FrozenDict) and isinstance(restored["b"], FrozenDict)
    assert hash(frozen["b"]) == hash(FrozenDict({"c": 1}))
