"""Entry point: `python -m verl_like.main_ppo [+trainer=PRESET] [key=value ...]`.

Composes configs/ppo_trainer.yaml with Hydra, converts and validates it into frozen dataclasses, checks it against
this machine (devices, logger packages, data files, run directory, ports: verl_like/trainer/preflight.py); every
error names the key and the fix, before Ray or any model starts. Then joins a Ray cluster ($RAY_ADDRESS /
trainer.ray_address) or starts a local one, and runs `PPOTrainer.fit()`.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("verl_like.main_ppo")


def run(overrides: list[str]) -> dict[str, float]:
    """Composes, validates and trains; returns the last step's metrics."""
    from verl_like.config.loader import ConfigError, load_config
    from verl_like.trainer.preflight import PreflightError, run_preflight

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
