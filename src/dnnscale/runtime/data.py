"""Synthetic, learnable training data: a fixed random teacher of class prototypes.

The teacher draws one prototype μ_c ~ N(0, 1) per class, with the workload's sample shape; a
sample of class y (uniform) is x = (2·μ_y + ε)/√5, ε ~ N(0, 1), so every value has unit
variance. Any of the runtime's networks (also conv + pooling, which would blur a random linear
labelling of raw noise) can learn it, so the loss falls. A replica cycles through a fixed pool of batches (made before training, outside the
timed steps); every partition of a replica sees the same batch at the same step.
"""

from __future__ import annotations

import math

import torch


class TeacherData:
    """Batch `step` of replica `replica`: pool batch (step·R + replica) mod pool_batches."""

    def __init__(self, input_shape: tuple[int, ...], classes: int, minibatch: int,
                 replicas: int, replica: int, seed: int, pool_batches: int = 8) -> None:
        generator = torch.Generator().manual_seed(seed * 7_919 + 17)
        prototypes = torch.randn((classes, *input_shape), generator=generator)  # (C, *sample)
        self.replicas, self.replica, self.pool_batches = replicas, replica, pool_batches
        self.batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for step in range(pool_batches):
            index = (step * replicas + replica) % pool_batches
            if index in self.batches:
                continue
            batch_gen = torch.Generator().manual_seed(seed * 7_919 + 1_000 + index)
            y = torch.randint(classes, (minibatch,), generator=batch_gen)  # (B,)
            noise = torch.randn((minibatch, *input_shape), generator=batch_gen)
            x = (2 * prototypes[y] + noise) / math.sqrt(5)  # unit variance per value
            self.batches[index] = (x, y)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[(step * self.replicas + self.replica) % self.pool_batches]
