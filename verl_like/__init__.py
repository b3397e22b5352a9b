"""verl_like: reinforcement learning for LLMs on Ray, FSDP2/Megatron and vLLM, with verl's keys and entry points."""

__version__ = "0.1.0"  # pyproject.toml's version (tests/unit/test_version.py keeps them equal)
