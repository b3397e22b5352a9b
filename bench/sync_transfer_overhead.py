"""Our side of the sliced weight sync alone (no vLLM, no collectives): the per-parameter cost of one rank's
`SlicedTransfer.run` on a deep, narrow Qwen2-shaped model whose tensors are too small to cost anything else.

The GPU runs (docs/benchmarks.md) found the sliced sync taking 40-50 ms whatever the model size, i.e. bound by
per-parameter work; this bench measures the part of it that is ours (planning lookups, views, allocations, copies)
on one rank at TP=1, where every slice is the rank's own shard. vLLM's `load_weights` is not included (the sink
drops the slices).

    python bench/sync_transfer_overhead.py                 # 24 layers (the 0.5B shape's 290 parameters)
    python bench/sync_transfer_overhead.py --layers 28 --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.shapes.decoder import DecoderShape
from verl_like.resharding.plan import build_sync_plan, param_specs
from verl_like.resharding.transfer import SlicedTransfer


class DroppingSink:
    def load(self, named_slices: list[tuple[str, torch.Tensor]]) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--bucket-mb", type=int, default=512)
    args = parser.parse_args()

    config = Qwen2Config(hidden_size=64, num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config)
    shape = DecoderShape.from_hf_config(config)
    shards = {name: param.detach() for name, param in model.named_parameters()}
    specs = param_specs([(name, tuple(t.shape)) for name, t in shards.items()], shape, element_size=2)
    plan = build_sync_plan(specs, 1, 1, shape, args.bucket_mb << 20)
    transfer = SlicedTransfer(plan, 0, torch.bfloat16, torch.device(args.device), timeout_s=60)
    sink = DroppingSink()
    times = []
    for i in range(args.repeats + 3):
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        transfer.run(shards, sink)
        if args.device == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    report = {"layers": args.layers, "params": len(specs), "device": args.device, "median_ms": median * 1e3,
              "us_per_param": median / len(specs) * 1e6}
    print(f"{len(specs)} parameters: {median * 1e3:.2f} ms per sync ({report['us_per_param']:.1f} us per parameter)")
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
