"""Model FLOPs of a decoder-only transformer's forward and training passes, and MFU against a device peak.

What is counted (model FLOPs, not hardware FLOPs; 2 FLOPs per multiply-add):
  per layer and valid token: every linear layer, 2 x P_layer with P_layer = h*q + 2*h*kv + q*h + 3*h*I
    (q, k, v, o projections and the gated MLP; q = heads x head_dim, kv = kv_heads x head_dim; biases, norms,
    rotary embeddings and activations are left out);
  per layer and sequence of s valid tokens: causal attention, QK^T and AV over the s(s+1)/2 visible pairs,
    2 x 2 x q x s(s+1)/2 = 2 q s(s+1);
  once per head token: the output head, 2 x h x head_width (the LM head only on the response tokens, where the
    engine computes logits; a value head of width 1 on every token).
  training = 3 x forward (the backward pass costs twice the forward); recomputation from gradient checkpointing
    is not counted.
So a training pass is 6 x (non-embedding linear parameters) x tokens + 6 x layers x q x sum s(s+1) + the head
term: the usual "6 N T" plus attention. bench/update_throughput.py counts the same terms.

MFU = FLOPs / (seconds x devices x peak). The peak is an estimate: DEFAULT_CUDA_PEAK_TFLOPS is a bf16 matmul
rate measured on an H200 (H100-class parts are in the same range); fp32 training or other GPUs need
trainer.peak_tflops_per_device. On CPU there is no default peak, so no MFU unless one is configured.
"""

from __future__ import annotations

import torch

from verl_like.shapes.decoder import DecoderShape

# bf16 dense matmul TFLOP/s per device assumed on CUDA when trainer.peak_tflops_per_device is null (an estimate).
DEFAULT_CUDA_PEAK_TFLOPS = 790.0


def forward_flops(shape: DecoderShape, sequence_lengths: torch.Tensor, head_tokens: int, head_width: int) -> float:
    """FLOPs of one forward pass over sequences of `sequence_lengths` valid tokens `(batch,)`.

    head_tokens: positions the output head runs on; head_width: its output size (vocab_size for an LM head over
    response tokens, 1 for a value or score head).
    """
    lengths = sequence_lengths.double()
    tokens = float(lengths.sum())
    q_width = shape.num_attention_heads * shape.head_dim
    per_layer = 2.0 * shape.linear_params_per_layer * tokens + 2.0 * q_width * float((lengths * (lengths + 1)).sum())
    head = 2.0 * shape.hidden_size * head_width * head_tokens
    return shape.num_hidden_layers * per_layer + head


def training_flops(shape: DecoderShape, sequence_lengths: torch.Tensor, head_tokens: int, head_width: int) -> float:
    """FLOPs of forward + backward over the same sequences: 3 x `forward_flops`."""
    return 3.0 * forward_flops(shape, sequence_lengths, head_tokens, head_width)


def resolve_peak_tflops(configured: float | None, device: str) -> float | None:
    """The peak TFLOP/s per device MFU divides by: `configured`, else DEFAULT_CUDA_PEAK_TFLOPS on cuda, else None."""
    if configured is not None:
        return configured
    return DEFAULT_CUDA_PEAK_TFLOPS if device == "cuda" else None


def mfu(flops: float, seconds: float, num_devices: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: flops / (seconds x num_devices x peak_tflops x 1e12)."""
    if seconds <= 0 or num_devices < 1 or peak_tflops <= 0:
        raise ValueError(
            f"mfu: seconds={seconds}, num_devices={num_devices} and peak_tflops={peak_tflops} must all be positive"
        )
    return flops / (seconds * num_devices * peak_tflops * 1e12)
