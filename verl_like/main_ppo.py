"""Entry point: `python -m verl_like.main_ppo [+trainer=PRESET] [key=value ...]`.

Composes configs/ppo_trainer.yaml with Hydra, converts and validates it into frozen dataclasses, checks it against
this machine (devices, logger packages, data files, run directory, ports: verl_like/trainer/preflight.py); every
error names the key and the fix, before Ray or any model starts. Then joins a Ray cluster ($RAY_ADDRESS /
trainer.ray_address) or starts a local one, and runs `PPOTrainer.fit()`.

`trainer.dry_run=true` (or `--dry-run`) stops before Ray: it composes and validates, runs the machine-independent
checks (data files and their scorers, a run directory that could be created; nothing written), and prints the
plan: roles, pools and devices, sizes per rank, the algorithm, what each verl key became and what is ignored and why.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("verl_like.main_ppo")


DRY_RUN_FLAGS = ("trainer.dry_run=true", "trainer.dry_run=True", "+trainer.dry_run=true", "--dry-run")


def split_dry_run(overrides: list[str]) -> tuple[list[str], bool]:
    """`overrides` without the dry-run flag, and whether it was there (`trainer.dry_run=false` is dropped too)."""
    rest = [o for o in overrides if o not in DRY_RUN_FLAGS and o.lstrip("+").lower() != "trainer.dry_run=false"]
    return rest, any(o in DRY_RUN_FLAGS for o in overrides)


def dry_run(overrides: list[str]) -> str:
    """Validates `overrides` without starting anything and returns the plan (verl_like/trainer/plan.py)."""
    from verl_like.config.loader import load_config
    from verl_like.config.verl_compat import translate_overrides
    from verl_like.trainer.plan import check_without_side_effects, describe_plan

    config = load_config(overrides)
    check_without_side_effects(config)
    return describe_plan(config, translate_overrides(overrides)[1])


def run(overrides: list[str]) -> dict[str, float]:
    """Composes, validates and trains; returns the last step's metrics (a dry run prints the plan, returns {})."""
    from verl_like.config.loader import ConfigError, load_config
    from verl_like.trainer.preflight import PreflightError, run_preflight

    overrides, only_plan = split_dry_run(overrides)
    if only_plan:
        try:
            print(dry_run(overrides))
        except PreflightError as err:
            raise SystemExit(f"preflight error: {err}") from None
        except ConfigError as err:
            raise SystemExit(f"config error: {err}") from None
        return {}
    try:
        config = load_config(overrides)  # hub ids resolved through the HF cache, paths checked
    except ConfigError as err:
        raise SystemExit(f"config error: {err}") from None
    try:
        run_preflight(config)
    except PreflightError as err:
        raise SystemExit(f"preflight error: {err}") from None
    from verl_like.trainer.launch import launch

    return launch(config, preflight=False)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    from verl_like.trainer.interrupts import TrainingInterrupted

    try:
        run(args)
    except TrainingInterrupted as stopped:  # preemption / `ray job stop` / Ctrl-C: checkpointed, workers released
        logger.warning("%s; resume_mode=auto continues from it", stopped)
        raise SystemExit(stopped.exit_code) from None


if __name__ == "__main__":
    main()
