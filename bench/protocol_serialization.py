"""Times DataProto serialization: pickle (in-band and out-of-band, as Ray does) and ray.put/get, against a TensorDict.

Usage: .venv/bin/python bench/protocol_serialization.py [--rows 256] [--seq-len 4096] [--repeats 5] [--no-ray]
Prints the best time of `--repeats` runs for each path; no assertion, a measurement to read.
"""

from __future__ import annotations

import argparse
import pickle
import time
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict

from verl_like.protocol import DataProto


def build_batch(rows: int, seq_len: int) -> DataProto:
    """A PPO-like batch: int64 token ids and mask (rows, seq_len), float/bf16/bool response tensors, prompts."""
    response_len = seq_len // 2
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 32000, (rows, seq_len), generator=generator),
        "attention_mask": torch.ones(rows, seq_len, dtype=torch.int64),
        "old_log_probs": torch.randn(rows, response_len, generator=generator),
        "advantages": torch.randn(rows, response_len, generator=generator),
        "ref_log_probs": torch.randn(rows, response_len, generator=generator).to(torch.bfloat16),
        "response_mask": torch.rand(rows, response_len, generator=generator) > 0.1,
    }
    prompts = [f"prompt number {i}: what is {i} + {i}?" for i in range(rows)]
    return DataProto.from_dict(tensors, {"raw_prompt": prompts, "uid": [str(i) for i in range(rows)]}, {"step": 1})


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def pickle_out_of_band(obj: Any) -> Any:
    """Pickle protocol 5 with buffers kept out of the stream, then load: the path Ray's serializer takes."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(payload, buffers=buffers)


def report(name: str, seconds: float, nbytes: int) -> None:
    print(f"{name:<50} {seconds * 1e3:8.2f} ms   {nbytes / seconds / 2**30:6.2f} GiB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ray", action="store_true", help="skip the ray.put/ray.get measurements")
    args = parser.parse_args()

    data = build_batch(args.rows, args.seq_len)
    tensordict = TensorDict(dict(data.batch.items()), batch_size=[len(data)])
    nbytes = sum(t.numel() * t.element_size() for t in data.batch.values())
    print(f"batch: {data}\ntensor bytes: {nbytes / 2**20:.1f} MiB; best of {args.repeats}")

    for name, obj in (("DataProto", data), ("TensorDict (tensors only)", tensordict)):
        payload = pickle.dumps(obj, protocol=5)
        report(f"{name}: pickle.dumps", best_time(lambda: pickle.dumps(obj, protocol=5), args.repeats), nbytes)
        report(f"{name}: pickle.loads", best_time(lambda: pickle.loads(payload), args.repeats), nbytes)
        report(f"{name}: dumps+loads, out-of-band", best_time(lambda: pickle_out_of_band(obj), args.repeats), nbytes)

    if args.no_ray:
        return
    import ray

    store_bytes = 256 << 20
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=store_bytes, log_to_driver=False)
    try:
        for name, obj in (("DataProto", data), ("TensorDict (tensors only)", tensordict)):
            # Fresh object-store pages cost a page fault each on first touch (tens of ms for 20 MiB); cycle
            # through the whole store first so both formats are timed on warm memory.
            for _ in range(2 * store_bytes // nbytes + 1):
                ray.put(obj)
            report(f"{name}: ray.put", best_time(lambda: ray.put(obj), args.repeats), nbytes)
            ref = ray.put(obj)
            report(f"{name}: ray.get", best_time(lambda: ray.get(ref), args.repeats), nbytes)
        restored = ray.get(ray.put(data))
        same = all(torch.equal(restored.batch[k], data.batch[k]) for k in data.batch.keys())
        same = same and np.array_equal(restored.non_tensor_batch["uid"], data.non_tensor_batch["uid"])
        print(f"DataProto round trip through Ray equal: {same}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
