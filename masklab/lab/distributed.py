"""Data parallelism that leaves the training loops unchanged (``torchrun``, DDP, gloo on CPU).

Under ``torchrun --nproc-per-node N -m masklab ...`` every process runs the same study with
the same seeds. Each training step, every rank draws the *same* global batch from the
shared generator and keeps its own slice (:func:`shard`); DDP averages the gradients, so a
step equals a single-process step on the global batch up to float summation order.
Only rank 0 writes files (:func:`is_main`); checkpoints are written by rank 0 and read
by every rank. Outside ``torchrun`` every helper is a no-op.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

from masklab.util import device as devices
from masklab.util.errors import MasklabError


def init_from_env() -> bool:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).
    Returns True when running distributed."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        if device().type == "cuda":
            torch.cuda.set_device(device())
        dist.init_process_group("nccl" if device().type == "cuda" else "gloo")
    return True


def device() -> torch.device:
    """This process's device: :func:`masklab.util.device.current` (the CLI's ``--device``; the CPU
    unless chosen), and under ``torchrun`` on CUDA ``cuda:LOCAL_RANK``. ``MASKLAB_DEVICE=cpu``
    (the switch from before ``--device``) still forces the CPU."""
    if os.environ.get("MASKLAB_DEVICE", "auto") == "cpu":
        return torch.device("cpu")
    dev = devices.current()
    if dev.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return dev


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def wrap(model: nn.Module) -> nn.Module:
    """DDP-wrap ``model`` when distributed (else return it). Use :func:`unwrap` to reach
    the model's own attributes (``blocks``, ``embed``...)."""
    if world_size() <= 1:
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device()] if device().type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def shard(*batch: Tensor) -> tuple[Tensor, ...]:
    """This rank's equal slice of each global-batch tensor (first dimension)."""
    n, w = world_size(), None
    if n <= 1:
        return batch
    size = batch[0].shape[0]
    if size % n:
        raise MasklabError(
            f"the global batch {size} is not divisible by the {n} processes; pick --batch as a multiple of {n}"
        )
    w = size // n
    r = rank()
    return tuple(t[r * w : (r + 1) * w] for t in batch)


def mean_across(value: Tensor) -> float:
    """Mean of a scalar over the ranks (e.g. the global batch's loss for logging)."""
    if world_size() <= 1:
        return float(value.detach())
    t = value.detach().clone().float().reshape(1)
    dist.all_reduce(t)
    return float(t) / world_size()
