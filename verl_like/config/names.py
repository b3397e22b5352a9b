"""The names config keys choose from, torch-free: fixed vocabularies, and the open sets plugins extend.

The modules that implement these names import their vocabularies from here (one definition). The three open sets
(advantage estimators, policy losses, KL estimators) list the built-in names; `verl_like.algorithms.registry`
adds every name registered with its decorators, so a user's `@register_advantage_estimator("mine")` validates
once the module that defines it has been imported, before the config is loaded (programmatic runs import it
first; tests/unit/config/test_names.py checks that the built-in lists match the registries).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from verl_like.config.errors import ConfigError

# Loss aggregation (algorithms/aggregation.py).
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Learning-rate schedules after warmup (engine/lr_schedule.py).
LR_SCHEDULERS = ("constant", "cosine")
# KL-in-reward coefficient controllers (algorithms/kl_control.py).
KL_CTRL_TYPES = ("fixed", "adaptive")
# Rollout-vs-old importance sampling (algorithms/rollout_is.py).
ROLLOUT_IS_LEVELS = ("token", "sequence", "geometric")
ROLLOUT_IS_MODES = ("truncate", "mask")
# Online DPO (algorithms/dpo.py).
DPO_LOSS_TYPES = ("sigmoid", "ipo")
TIE_BREAKING = ("skip", "random")
# On-policy distillation divergences (algorithms/distillation.py).
DISTILLATION_LOSSES = ("forward_kl", "reverse_kl", "jsd")
# What a failed reward sample does to the run (rewards/error_policy.py).
ERROR_POLICIES = ("fail", "zero", "skip")
# trainer.logger backends (utils/tracking.py).
LOGGER_BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


class NameSet:
    """The names one config key accepts: the built-in ones, plus those plugins register (`add`)."""

    def __init__(self, kind: str, config_key: str, builtin: Iterable[str]) -> None:
        self.kind = kind
        self.config_key = config_key
        self._names = set(builtin)

    def add(self, name: str) -> None:
        """Accepts `name` from now on (a registry calls this for every name it registers)."""
        self._names.add(name)

    def names(self) -> list[str]:
        """Every accepted name, sorted."""
        return sorted(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def check(self, key: str, value: str) -> None:
        """ConfigError naming `key`, the closest accepted name and all of them, unless `value` is accepted."""
        if value in self._names:
            return
        names = self.names()
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{key}={value!r} is not a registered {self.kind}; {hint}valid names: {', '.join(names)}")


ADVANTAGE_ESTIMATOR_NAMES = NameSet(
    "advantage estimator", "algorithm.adv_estimator",
    ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"),
)
POLICY_LOSS_NAMES = NameSet("policy loss", "actor.policy_loss.loss_mode", ("gpg", "gspo", "vanilla"))
KL_ESTIMATOR_NAMES = NameSet(
    "KL estimator", "algorithm.kl_penalty / actor.kl_loss_type",
    ("abs", "k1", "k1+", "k2", "k3", "k3+", "kl", "low_var_kl", "mse"),
)
