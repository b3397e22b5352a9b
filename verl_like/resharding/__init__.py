"""The hybrid engine: moves the trainer's FSDP shards into the rollout engine's tensor-parallel shards.

layout.py: where each HF parameter lives in vLLM under TP (the one HF<->vLLM layout module);
plan.py: which rows go from which training rank to which rollout rank, in buckets;
transfer.py: runs a plan over torch.distributed (P2P, timeouts, stats);
vllm_loader.py: puts the slices into vLLM's parameters in place;
sync.py: the two sync paths a worker calls (sliced, and full tensors through vLLM's own loader).
"""
