# The two commands of the README's quick start. Both set up .venv first (idempotent, ~20 s the first time).
PY := .venv/bin/python

.PHONY: setup run test

setup:
	bash scripts/setup.sh

# The main job on its embedded default (tiny model, synthetic task, GRPO, vLLM rollout, FSDP2 on 2 CPU workers).
run: setup
	$(PY) -m verl_like.main_ppo $(ARGS)

# The CPU test suite (unit + integration with real Ray, vLLM and FSDP2); GPU tests skip without CUDA.
test: setup
	$(PY) -m pytest tests -q -ra --durations=80 $(ARGS)
