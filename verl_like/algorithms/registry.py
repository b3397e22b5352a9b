"""Name -> function registries behind every config choice in verl_like.algorithms.

Each registry knows the config key that selects from it, so an unknown name fails with the key, the bad value and
the valid names. Users extend a registry with its decorator, e.g. ``@register_advantage_estimator("my_adv")``; the
name also goes into the torch-free NameSet the config validates against (verl_like/config/names.py).
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from verl_like.config.names import (
    ADVANTAGE_ESTIMATOR_NAMES,
    KL_ESTIMATOR_NAMES,
    POLICY_LOSS_NAMES,
    NameSet,
)

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named set of functions selected by one config key."""

    def __init__(self, kind: str, config_key: str, accepted: NameSet | None = None) -> None:
        self.kind = kind
        self.config_key = config_key
        self.accepted = accepted  # the config's names for this key; every registered name joins it
        self._entries: dict[str, F] = {}

    def register(self, name: str, *aliases: str) -> Callable[[F], F]:
        """Decorator: register the function under `name` (and `aliases`); a name already taken raises ValueError."""

        def decorator(fn: F) -> F:
            for key in (name, *aliases):
                if not isinstance(key, str) or not key:
                    raise ValueError(f"{self.kind} names must be non-empty strings, got {key!r}")
                if key in self._entries:
                    raise ValueError(
                        f"{self.kind} {key!r} is already registered (by {self._entries[key].__qualname__}); "
                        f"pick another name"
                    )
            for key in (name, *aliases):
                self._entries[key] = fn
                if self.accepted is not None:
                    self.accepted.add(key)
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered under `name`; unknown names raise ValueError listing the valid ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"{self.config_key}={name!r} is not a known {self.kind}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """All registered names (aliases included), sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", "algorithm.adv_estimator", ADVANTAGE_ESTIMATOR_NAMES)
POLICY_LOSSES: Registry = Registry("policy loss", "actor.policy_loss.loss_mode", POLICY_LOSS_NAMES)
KL_ESTIMATORS: Registry = Registry("KL estimator", "algorithm.kl_penalty / actor.kl_loss_type", KL_ESTIMATOR_NAMES)


def register_advantage_estimator(name: str, *aliases: str) -> Callable[[F], F]:
    """Decorator registering an advantage estimator (signature: see ``advantages.AdvantageEstimator``)."""
    return ADVANTAGE_ESTIMATORS.register(name, *aliases)


def get_advantage_estimator(name: str) -> Callable:
    """The advantage estimator registered as `name` (config key ``algorithm.adv_estimator``)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def register_policy_loss(name: str, *aliases: str) -> Callable[[F], F]:
    """Decorator registering a policy loss (signature: see ``policy_loss.PolicyLossFn``)."""
    return POLICY_LOSSES.register(name, *aliases)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name` (config key ``actor.policy_loss.loss_mode``)."""
    return POLICY_LOSSES.get(name)


def register_kl_estimator(name: str, *aliases: str) -> Callable[[F], F]:
    """Decorator registering a per-token KL estimator ``fn(log_probs, ref_log_probs) -> (batch, response_len)``."""
    return KL_ESTIMATORS.register(name, *aliases)


def get_kl_estimator(name: str) -> Callable:
    """The KL estimator registered as `name` (config keys ``algorithm.kl_penalty`` and ``actor.kl_loss_type``)."""
    return KL_ESTIMATORS.get(name)
