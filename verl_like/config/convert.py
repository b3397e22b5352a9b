"""Plain nested mappings (composed OmegaConf) -> frozen config dataclasses, by the dataclasses' type hints.

Every error names the full dotted key: an unknown key also names the closest valid key (difflib), a wrong type
names the value and the expected type, and a node's own check (`__post_init__`) is re-raised with the node's
dotted path. Lists become tuples and mappings `FrozenDict`, so nothing in a converted config can be mutated.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from verl_like.config.errors import ConfigError

class FrozenDict(dict):
    """A read-only dict (free-form config mappings such as `override_config`); pickles as a plain dict copy."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("config mappings are read-only; build a new config instead of editing this one")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore

    def __reduce__(self) -> tuple:
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda item: str(item[0]))))


def freeze(value: Any) -> Any:
    """`value` with lists turned into tuples and dicts into FrozenDicts, recursively."""
    if isinstance(value, Mapping):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _init_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def valid_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree rooted at dataclass `cls` (nodes and leaves), in declaration order."""
    keys = []
    hints = _hints(cls)
    for f in _init_fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        node = _dataclass_in(hints[f.name])
        if node is not None:
            keys.extend(valid_keys(node, key + "."))
    return keys


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass a field of type `tp` holds (also through `X | None`), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def closest_key(bad_key: str, keys: list[str]) -> str | None:
    """The valid key a misspelt/misplaced `bad_key` most likely meant: same name elsewhere, else the nearest."""
    parent, _, leaf = bad_key.rpartition(".")
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
    if same_leaf:
        return difflib.get_close_matches(bad_key, same_leaf, n=1, cutoff=0.0)[0]
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    # A sibling that extends the name (verl's ppo_micro_batch_size -> ppo_micro_batch_size_per_gpu) beats spelling.
    extended = [name for name in siblings if name.startswith(leaf) or leaf.startswith(name)]
    match = difflib.get_close_matches(leaf, extended, n=1, cutoff=0.0) if extended else []
    match = match or difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if match:
        return siblings[match[0]]
    # Elsewhere in the tree, compare the last names only: whole dotted keys share long prefixes, which made
    # `actor.use_torch_compile` look like `actor.entropy_coeff`.
    leaves = {k.rpartition(".")[2]: k for k in keys}
    match = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[match[0]] if match else None


def unknown_key_message(bad_key: str, keys: list[str]) -> str:
    """`unknown config key 'x.y'; did you mean 'x.z'?` plus the keys valid at that level."""
    parent = bad_key.rpartition(".")[0]
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    hint = closest_key(bad_key, keys)
    message = f"unknown config key {bad_key!r}"
    message += f"; did you mean {hint!r}?" if hint else "."
    where = f"under {parent!r}" if parent else "at the top level"
    if siblings:
        message += f" Valid keys {where}: {', '.join(siblings)}"
    return message


def type_name(tp: Any) -> str:
    """A reader's name for a type hint: 'int', 'list of str', 'int or null', one of (...)."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"list of {len(args)} ({', '.join(type_name(a) for a in args)})"
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return f"mapping ({tp.__name__} node)"
    if tp is Any:
        return "any value"
    return getattr(tp, "__name__", str(tp))


def _wrong_type(key: str, value: Any, tp: Any) -> ConfigError:
    return ConfigError(
        f"{key}={value!r} has the wrong type: expected {type_name(tp)}, got {type(value).__name__}; "
        f"set {key} to a value of type {type_name(tp)}"
    )


def convert_value(tp: Any, value: Any, key: str, keys: list[str] | None = None) -> Any:
    """`value` converted to type hint `tp` (dataclasses built recursively); ConfigError naming `key` if it fails.

    `keys`: every valid dotted key of the whole tree, for unknown-key suggestions (default: the node's own keys).
    """
    origin = typing.get_origin(tp)
    if tp is Any:
        return freeze(value)
    if tp is type(None):
        if value is None:
            return None
        raise _wrong_type(key, value, tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _wrong_type(key, value, tp)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert_value(arg, value, key, keys)
            except ConfigError as err:
                if dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                    raise err  # the value is that node: its own error says more than "wrong type"
        raise _wrong_type(key, value, tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices and type(value) in {type(c) for c in choices}:
            return value
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(repr(c) for c in choices)}")
    if dataclasses.is_dataclass(tp):
        return build_node(tp, value, key, keys)
    if origin in (tuple, list) or tp in (tuple, list):
        return _convert_sequence(tp, value, key, keys)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _wrong_type(key, value, tp)
        args = typing.get_args(tp)
        value_tp = args[1] if len(args) == 2 else Any
        return FrozenDict({k: convert_value(value_tp, v, f"{key}.{k}") for k, v in value.items()})
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _wrong_type(key, value, tp)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _wrong_type(key, value, tp)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _wrong_type(key, value, tp)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _wrong_type(key, value, tp)
    raise TypeError(f"config field {key} has a type hint verl_like.config cannot convert: {tp!r}")


def _convert_sequence(tp: Any, value: Any, key: str, keys: list[str] | None) -> tuple | list:
    if not isinstance(value, (list, tuple)):
        raise _wrong_type(key, value, tp)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigError(f"{key}={list(value)!r} must have exactly {len(args)} entries ({type_name(tp)})")
        return tuple(convert_value(a, v, f"{key}[{i}]", keys) for i, (a, v) in enumerate(zip(args, value)))
    item_tp = args[0] if args else Any
    items = [convert_value(item_tp, v, f"{key}[{i}]", keys) for i, v in enumerate(value)]
    return items if (typing.get_origin(tp) or tp) is list else tuple(items)


def _with_path(message: str, path: str) -> str:
    """A node's own error message rewritten to start with the node's full dotted path."""
    if not path or message.startswith(path):
        return message
    leaf = path.rpartition(".")[2]
    if message.startswith(leaf + "."):
        return path + message[len(leaf):]
    return f"{path}: {message}"


def build_node(cls: type, value: Any, path: str, keys: list[str] | None = None) -> Any:
    """Dataclass `cls` built from mapping `value` found at dotted `path` ('' for the root).

    `keys`: every valid dotted key of the whole tree (for suggestions); default: this node's keys under `path`.
    """
    if not isinstance(value, Mapping):
        raise _wrong_type(path or "<root>", value, cls)
    prefix = f"{path}." if path else ""
    fields = {f.name: f for f in _init_fields(cls)}
    for name in value:
        if name not in fields:
            raise ConfigError(unknown_key_message(f"{prefix}{name}", keys or valid_keys(cls, prefix)))
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in value:
            raise ConfigError(f"{prefix}{name} is required but not set; add it to the config")
    hints = _hints(cls)
    kwargs = {name: convert_value(hints[name], raw, f"{prefix}{name}", keys) for name, raw in value.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError(_with_path(str(err), path)) from err
