"""The weight path: moves the trainer's shards into the rollout engine(s).

layout.py: where each HF parameter lives in vLLM under TP (the one HF<->vLLM layout module);
plan.py: which rows go from which training rank to which rollout rank, in buckets;
transfer.py: runs a plan over torch.distributed (P2P, timeouts, stats) into the engine's slice loader
  (vLLM's lives in rollout/vllm_slice_loader.py: no module here touches vLLM internals);
sync.py: the sliced sync of a colocated engine, and the full-tensor reference;
gloo.py: a side process group for processes started apart (trainer <-> vLLM servers);
transports/: the `WeightTransport` interface and one transport per file (colocated sliced, full, server).
"""
