"""The weight path: moves the trainer's shards into the rollout engine(s).

It sits above engine/ and rollout/ and imports both; neither imports it. Where each HF parameter lives in vLLM
under TP is `verl_like/shapes/layout.py`, the side gloo group `verl_like/utils/gloo.py`, both below all three.

plan.py: which rows go from which training rank to which rollout rank, in buckets;
transfer.py: runs a plan over torch.distributed (P2P, timeouts, stats) into the engine's slice loader
  (vLLM's lives in rollout/vllm_slice_loader.py: no module here touches vLLM internals);
transports/: the `WeightTransport` interface and one transport per file (colocated sliced, full, server).
"""
