"""PromptLoader: batches of an RLDataset in a seeded order, with a state that resumes at the exact next batch.

The order of epoch e is a permutation drawn from `numpy.random.default_rng([seed, e])` (or the file order when
`shuffle` is off), so it depends on nothing but (seed, epoch): a loader restored from `state_dict()` in a new
process yields the same batches the original would have yielded next.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import numpy as np

from verl_like.data.dataset import RLDataset
from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)


class PromptLoader:
    """Iterates `dataset` in batches of `batch_size` prompts (DataProto, from `dataset.collate`).

    One `for batch in loader` pass yields the rest of the current epoch, then moves to the next epoch.
    drop_last: drop the last, smaller batch of an epoch (training); keep it for validation.
    """

    def __init__(
        self,
        dataset: RLDataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if drop_last and batch_size > len(dataset):
            raise ValueError(
                f"data.train_batch_size={batch_size} is larger than the dataset ({len(dataset)} prompts after "
                "filtering); lower the batch size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # batches of the current epoch already yielded

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The dataset indices of `epoch` in the order they are served."""
        if not self.shuffle:
            return np.arange(len(self.dataset))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))

    def __iter__(self) -> Iterator[DataProto]:
        order = self.epoch_order(self.epoch)
        while self.position < len(self):
            picked = order[self.position * self.batch_size : (self.position + 1) * self.batch_size]
            self.position += 1
            yield self.dataset.collate([self.dataset[int(i)] for i in picked])
        self.epoch += 1
        self.position = 0

    def next_batch(self) -> DataProto:
        """The next batch, moving on to the next epoch when the current one is used up."""
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        return next(iter(self))

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: epoch, batches yielded in it, and the order's identity."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state`; raises when it was saved for another dataset size, batch size or order."""
        mine = {"seed": self.seed, "shuffle": self.shuffle, "batch_size": self.batch_size,
                "dataset_size": len(self.dataset)}
        for key, value in mine.items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"dataloader state was saved with {key}={state[key]!r} but this loader has {key}={value!r}; "
                    "resume with the same data files and data.* settings, or start a fresh run"
                )
        if not 0 <= int(state["position"]) <= len(self):
            raise ValueError(f"dataloader state position={state['position']} is outside 0..{len(self)}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
