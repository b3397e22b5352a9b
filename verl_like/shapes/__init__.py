"""What a decoder model's tensors look like, below every package that moves them.

decoder.py: `DecoderShape`, a decoder's sizes (the vLLM layout, the Megatron converter and the FLOP count read it);
layout.py: the HF <-> vLLM tensor-parallel layout (`Box`, `ParamSpec`, `tp_slice`, ...), read by the training
engines (which rectangle a rank holds), the rollout engines' slice loaders and the resharding plan.
Imports no other verl_like package, so engine/, rollout/ and resharding/ all stand on it without a loop.
"""
