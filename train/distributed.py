"""Where this process stands in a torchrun job (rank 0 of 1 without one)."""
from __future__ import annotations

import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
