"""One run of a study: its spec (:class:`RunSpec`) and :func:`execute`, which runs it and
returns the record written to ``runs/<key>.json``. Every executor (:mod:`masklab.lab.executors`)
and the worker process call :func:`execute`; specs and records are plain JSON."""

from __future__ import annotations

import importlib
import time
from functools import lru_cache
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from threadpoolctl import threadpool_limits

from masklab.util import device as devices
from masklab.lab import revision
from masklab.util.errors import MasklabError


@dataclass
class RunSpec:
    """One run of a study. ``params`` must be JSON-serialisable.

    ``model`` names the pretrained model a run uses (studies of real LMs: stale, cite,
    prune); it is left out of :attr:`key` and :meth:`as_dict` when empty, so the run keys
    and stored specs of every other study (and resuming their output directories) do not
    depend on it."""

    task: str
    method: str
    seed: int
    params: dict = field(default_factory=dict)
    model: str = ""

    @property
    def key(self) -> str:
        model = f"__{self.model}" if self.model else ""
        raw = f"{self.task}{model}__{self.method}__s{self.seed}"
        return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in raw)

    def as_dict(self) -> dict:
        """The spec a run function receives and ``runs/<key>.json`` stores (no empty ``model``)."""
        d = asdict(self)
        if not self.model:
            del d["model"]
        return d


def resolve(path: str) -> Callable:
    """Import ``"masklab.module:function"`` (only masklab's own functions)."""
    module, _, name = path.partition(":")
    if not module.startswith("masklab.") or not name:
        raise MasklabError(f"not a masklab run function: {path!r}")
    return getattr(importlib.import_module(module), name)


def execute(
    fn_path: str, spec: dict, ckpt_dir: Path, threads: int, device: str | None = None, precision: str | None = None
) -> dict:
    """Run one spec and return its result record (what lands in ``runs/<key>.json``), with
    the code that made it (``code``, ``code_ast``, ``git_rev``: :mod:`masklab.lab.revision`;
    the hashes are taken before the run starts, once per process) and where it
    computed (``device``, ``device_name``, ``precision``: :func:`masklab.util.device.describe`).

    torch and the BLAS under numpy use ``threads`` threads, so a run's numbers do not depend
    on the machine's core count or on where it ran (in-process, a worker, a Ray task).
    ``device`` / ``precision`` (default: :func:`masklab.util.device.current` /
    :func:`masklab.util.device.precision`) are set for the run's duration; the run function reads
    them from :mod:`masklab.util.device`, so the spec (and the run's key) does not name them."""
    code, code_ast = fn_code(fn_path), fn_code_ast(fn_path)  # before the run: the code it runs, not the code at its end
    torch.set_num_threads(threads)
    dev = devices.current() if device is None else device
    prec = devices.precision() if precision is None else precision
    start = time.perf_counter()
    with threadpool_limits(threads), devices.using(dev, prec) as where:
        out = resolve(fn_path)(spec, Path(ckpt_dir))
        if where.type == "cuda":
            torch.cuda.synchronize(where)
    model = {"model": spec["model"]} if spec.get("model") else {}
    return {
        "task": spec["task"],
        **model,
        "method": spec["method"],
        "seed": spec["seed"],
        "metrics": out.get("metrics", {}),
        "seconds": round(time.perf_counter() - start, 3),
        "curves": out.get("curves", {}),
        "extra": out.get("extra", {}),
        "spec": spec,
        "code": code,
        "code_ast": code_ast,
        "git_rev": revision.git_rev(),
        **devices.describe(where, prec),
    }


@lru_cache(maxsize=None)
def fn_code(fn_path: str) -> str:
    """:func:`masklab.lab.revision.code_hash` of the module of ``"masklab.module:function"``
    (once per process: about a second to read the package's source)."""
    return revision.code_hash(fn_path.partition(":")[0])


@lru_cache(maxsize=None)
def fn_code_ast(fn_path: str) -> str:
    """:func:`masklab.lab.revision.code_ast` of the module of ``"masklab.module:function"`` (once per process)."""
    return revision.code_ast(fn_path.partition(":")[0])
