"""Where runs compute: the device (``--device auto|cpu|cuda``) and the precision
(``--precision fp32|bf16|fp16``) of every study, real-LM command and Python call.

* :func:`resolve` turns a name into a ``torch.device``: ``auto`` is CUDA when
  ``torch.cuda.is_available()``, else the CPU; ``cuda`` (or ``cuda:N``) on a machine without
  CUDA is one :class:`~masklab.util.errors.MasklabError`, never a traceback from deep inside torch.
* :func:`use` sets the device and precision the following runs use (the CLI calls it once per
  command, as it does :func:`masklab.lab.executors.use`); :func:`current` and :func:`precision`
  read them back. :func:`masklab.lab.runs.execute` sets them around each run, so a run in a worker
  subprocess or a Ray task computes where the command asked.
* :func:`describe` is what results record: ``{"device": "cuda", "device_name": "NVIDIA H200"}``.
* :func:`of` is the device a module's parameters live on (where its inputs go);
  :func:`synchronize` waits for CUDA's queued work before a clock is read.
* :func:`autocast` is the optional bf16/fp16 autocast around a forward pass (``fp32``: no
  autocast, the numbers of a run without it). :func:`grad_scaler` is the loss scaler fp16
  training needs on CUDA (``None`` otherwise).

Data is drawn on the CPU from the run's CPU generator and then moved (:func:`to`), so a run's
random draws are the same on every device; only the arithmetic differs (within the
tolerances the ``gpu`` tests state).

This module imports nothing from masklab but :mod:`masklab.util.errors` (a leaf).
"""

from __future__ import annotations

import contextlib
import platform
from typing import Any, Iterator

import torch

from masklab.util.errors import MasklabError

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

_STATE: dict[str, Any] = {"device": torch.device("cpu"), "precision": "fp32", "auto": False}


def cuda_available() -> bool:
    """``torch.cuda.is_available()`` (a function of its own so tests can pretend)."""
    return torch.cuda.is_available()


def resolve(name: str | torch.device | None = "auto") -> torch.device:
    """``auto`` (or None) -> CUDA when available, else CPU; ``cpu``; ``cuda`` / ``cuda:N``.

    Raises one :class:`MasklabError` for an unknown name or CUDA on a machine without it."""
    if isinstance(name, torch.device):
        name = str(name)
    name = "auto" if name is None else str(name).strip().lower()
    if name == "auto":
        return torch.device("cuda") if cuda_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    base, _, index = name.partition(":")
    if base != "cuda" or (index and not index.isdigit()):
        raise MasklabError(f"unknown device {name!r}; choose from {', '.join(DEVICES)} (or cuda:N)")
    if not cuda_available():
        built = torch.version.cuda
        why = (
            f"this torch ({torch.__version__}) was built without CUDA"
            if built is None
            else "no CUDA device is visible (torch.cuda.is_available() is False)"
        )
        raise MasklabError(f"--device {name}: this machine has no CUDA GPU: {why}; use --device cpu or auto")
    if index and int(index) >= torch.cuda.device_count():
        raise MasklabError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device(name)


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise MasklabError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return precision


def use(name: str | torch.device | None = "cpu", precision: str = "fp32", auto: bool | None = None) -> torch.device:
    """Set the device and precision of the following runs; return the device. ``auto``: whether
    ``auto`` chose it (default: whether ``name`` is ``auto``), see :func:`for_study`."""
    dev = resolve(name)
    if auto is None:
        auto = name is None or str(name).strip().lower() == "auto"
    _STATE.update(device=dev, precision=check_precision(precision), auto=auto)
    return dev


def chosen_by_auto() -> bool:
    """Whether the current device was picked by ``auto`` (so a study that runs on the CPU only
    may fall back to the CPU instead of refusing)."""
    return bool(_STATE["auto"])


def for_study(study: str, supported: tuple[str, ...]) -> torch.device | None:
    """The device a study whose run function computes on ``supported`` device types
    (its module's ``DEVICES``; ``("cpu",)`` when it declares none) runs on: None when the
    current device is supported; the CPU when ``auto`` chose an unsupported one; else one
    :class:`MasklabError`."""
    dev = current()
    if dev.type in supported:
        return None
    if chosen_by_auto():
        return torch.device("cpu")
    raise MasklabError(
        f"{study} runs on {', '.join(supported)} only: its runs do not move their models and data to "
        f"{dev.type} yet; use --device cpu (or auto, which falls back to the CPU for it)"
    )


def current() -> torch.device:
    """The device runs use now (the CPU unless :func:`use` chose another)."""
    return _STATE["device"]


def precision() -> str:
    """The precision runs use now (``fp32`` unless :func:`use` chose another)."""
    return _STATE["precision"]


@contextlib.contextmanager
def using(name: str | torch.device | None, precision: str = "fp32", auto: bool | None = None) -> Iterator[torch.device]:
    """:func:`use` for the duration of a ``with`` block, then restore the previous choice."""
    before = dict(_STATE)
    try:
        yield use(name, precision, auto)
    finally:
        _STATE.update(before)


def device_name(dev: torch.device | str) -> str:
    """A person's name for the device: the GPU's name on CUDA, the CPU model (or machine) on CPU."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:  # Linux: the CPU's model name
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe(dev: torch.device | str | None = None, prec: str | None = None) -> dict[str, str]:
    """``{"device": "cpu"|"cuda", "device_name": ..., "precision": ...}``: what results record."""
    dev = current() if dev is None else torch.device(dev)
    return {"device": dev.type, "device_name": device_name(dev), "precision": prec or precision()}


def to(x: Any, dev: torch.device | None = None) -> Any:
    """Move a tensor (or a list/tuple/dict of them) to ``dev`` (default :func:`current`);
    anything else is returned as it is. A no-op on the CPU."""
    dev = current() if dev is None else dev
    if torch.is_tensor(x):
        return x if x.device == dev else x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(to(v, dev) for v in x)
    if isinstance(x, dict):
        return {k: to(v, dev) for k, v in x.items()}
    return x


def of(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s parameters (its first one; the CPU for a module without any):
    where its inputs must go."""
    first = next(module.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def synchronize(dev: torch.device | str | None = None) -> None:
    """Wait until the work queued on ``dev`` (default :func:`current`) is done: CUDA runs
    asynchronously, so a clock read after a forward pass needs this first. A no-op on the CPU."""
    dev = current() if dev is None else torch.device(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def autocast(dev: torch.device | None = None, prec: str | None = None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to bf16/fp16 on ``dev`` for precision ``prec`` (defaults: the current
    ones); a null context for ``fp32``."""
    dev = current() if dev is None else torch.device(dev)
    prec = precision() if prec is None else check_precision(prec)
    if prec == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(dev.type, dtype=_DTYPES[prec])


def grad_scaler(dev: torch.device | None = None, prec: str | None = None) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 training on CUDA (fp16 gradients underflow without one); None otherwise."""
    dev = current() if dev is None else torch.device(dev)
    prec = precision() if prec is None else prec
    return torch.amp.GradScaler("cuda") if prec == "fp16" and dev.type == "cuda" else None
