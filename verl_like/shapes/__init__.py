"""What a decoder model's tensors look like, below every package that moves them.

layout.py: the HF <-> vLLM tensor-parallel layout (`Box`, `ParamSpec`, `tp_slice`, ...), read by the training
engines (which rectangle a rank holds), the rollout engines' slice loaders and the resharding plan. It imports no
other verl_like package, so engine/, rollout/ and resharding/ can all stand on it without a loop.
"""
