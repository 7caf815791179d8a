"""Seeds, checkpoints, resume, the results store and progress: shared by every study.

A study is a list of :class:`RunSpec` (task, method, seed, params, and the pretrained model
for studies of real LMs) and a *run function*
``fn(spec: dict, ckpt_dir: Path) -> {"metrics": {...}, "curves": {...}, "extra": {...}}``
named by its import path (``"masklab.lab.studies.gotu:run_one"``). :func:`run_study`:

* skips runs whose result file already exists with the same spec, was made by the same
  code (resume: the same ``code_ast``, or ``code`` for a record without one;
  :mod:`masklab.lab.revision`) and on the same kind of device in the same
  precision (:mod:`masklab.util.device`; a record without ``device`` was made on the CPU in
  fp32); any other run is run again, from scratch, unless :data:`KEEP_OLD_RUNS` (the CLI's
  ``--keep-old-runs``) keeps it;
* runs the rest with an executor (:mod:`masklab.lab.executors`): in-process (``jobs=1``), in
  ``jobs`` worker processes (``python -m masklab.lab.worker``) or as Ray tasks on a cluster;
  specs and results travel as JSON, nothing is pickled;
* writes ``DIR/runs/<key>.json`` per run as soon as it finishes, then ``results.json``
  and ``results.md`` (the schema is in docs/design.md).

Each run is deterministic given its seed: torch uses ``threads`` threads (default 1) in
every run whatever ``jobs`` is, so results do not depend on how the study was scheduled.
Long runs checkpoint themselves with :class:`Checkpoint` (safetensors + JSON, written to a
temporary file and renamed) and continue from it after a kill.
"""

from __future__ import annotations

import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from masklab.util import device as devices
from masklab.lab import distributed, executors, revision
from masklab.util.errors import MasklabError  # noqa: F401 (re-export)
from masklab.util.files import atomic_write_text, read_json, write_json
from masklab.lab.runs import RunSpec, fn_code, fn_code_ast, resolve  # noqa: F401 (re-exported: studies build their runs from the runner's API)

# Keep finished runs made by other code (another code hash) instead of running them again.
# Set by the CLI's --keep-old-runs for one command; results.md then says the table mixes code.
KEEP_OLD_RUNS = False


# MasklabError lives in masklab.util.errors (no masklab imports, so no cycles); re-exported here
# because many modules import it from the runner.


# ----------------------------------------------------------------------------- seeds


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a fresh torch generator for data sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed + 1_000_003)


def warmup_cosine(step: int, steps: int, lr: float, warmup: int, floor: float = 0.0) -> float:
    """Learning rate at ``step``: linear warm-up over ``warmup`` steps, then cosine decay
    from ``lr`` to ``floor * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


# ----------------------------------------------------------------------------- checkpoints


class Checkpoint:
    """Mid-run checkpoint of a model, its optimizer and the data generator.

    Files: ``DIR/ckpt.safetensors`` (tensors) and ``DIR/ckpt.json`` (step, optimizer
    hyper-parameters and any JSON ``extra`` such as curves so far). Nothing is pickled.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    @property
    def exists(self) -> bool:
        return (self.dir / "ckpt.json").exists() and (self.dir / "ckpt.safetensors").exists()

    def save(
        self, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, extra: dict
    ) -> None:
        # cloned: tied weights (a GPT's embedding and LM head) share memory, which safetensors refuses
        # (.cpu(): a model on CUDA is saved as CPU tensors, a no-op on the CPU)
        tensors = {f"model.{k}": v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
        opt_state = opt.state_dict()
        for pid, st in opt_state["state"].items():
            for name, val in st.items():
                t = val if torch.is_tensor(val) else torch.tensor(val)
                tensors[f"opt.{pid}.{name}"] = t.detach().cpu().contiguous()
        tensors["rng.torch"] = torch.get_rng_state()
        tensors["rng.gen"] = gen.get_state()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".ckpt.{os.getpid()}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, self.dir / "ckpt.safetensors")
        write_json(self.dir / "ckpt.json", {"step": step, "param_groups": opt_state["param_groups"], "extra": extra})

    def load(self, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> tuple[int, dict]:
        """Restore everything in place; return ``(step, extra)``."""
        meta = read_json(self.dir / "ckpt.json")
        tensors = load_file(str(self.dir / "ckpt.safetensors"))
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        state: dict[int, dict] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, pid, name = k.split(".", 2)
                state.setdefault(int(pid), {})[name] = v
        opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        torch.set_rng_state(tensors["rng.torch"])
        gen.set_state(tensors["rng.gen"])
        return meta["step"], meta["extra"]

    def clear(self) -> None:
        for name in ("ckpt.json", "ckpt.safetensors"):
            (self.dir / name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- studies


def environment() -> dict:
    """Versions, threads and git revision, recorded in every results.json."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads_per_run": None,
        "git_rev": revision.git_rev(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def summary_row(task: str, model: str, method: str, n: int) -> dict[str, Any]:
    """The key columns of a summary row; ``model`` only when set."""
    return {"task": task, **({"model": model} if model else {}), "method": method, "n": n}


def summarize(runs: list[dict]) -> list[dict]:
    """Mean, std (sample, ddof=1) and n of every numeric metric per (task, model, method)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r.get("model", ""), r["method"]), []).append(r["metrics"])
    rows = []
    for (task, model, method), metrics in groups.items():
        row = summary_row(task, model, method, len(metrics))
        names = [k for k in metrics[0] if isinstance(metrics[0][k], (int, float)) or metrics[0][k] is None]
        for name in names:
            add_stats(row, name, [m.get(name) for m in metrics])
        rows.append(row)
    return rows


def add_stats(row: dict[str, Any], name: str, values: list) -> None:
    """``row[NAME_mean]``, ``row[NAME_std]`` (sample, ddof=1) over the finite numbers among
    ``values`` (None, NaN and inf are left out; None for both when nothing is left; the std
    is None for a single value: one run measures no spread)."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    row[f"{name}_mean"] = float(np.mean(vals)) if vals else None
    row[f"{name}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else None


def claim_checkpoint(ckpt_dir: Path, code: str, also: str | None = None) -> None:
    """A run about to start continues from its checkpoint only if the same code wrote it:
    a ``ckpt_dir`` stamped with other code than ``code`` or ``also`` (a checkpoint stamped
    with the older ``code`` hash), or with none, is emptied first; then it is stamped ``code``."""
    stamp = ckpt_dir / "code.txt"
    if ckpt_dir.exists() and (not stamp.exists() or stamp.read_text().strip() not in {code, also}):
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, code + "\n")


def code_counts(runs: list[dict], key: str = "code") -> dict[str, int]:
    """How many runs each code hash (``key``: ``code`` or ``code_ast``) made (``"unknown"``
    for records older than that hash)."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.get(key) or "unknown"] = counts.get(r.get(key) or "unknown", 0) + 1
    return counts


def run_study(
    study: str,
    config: dict,
    specs: list[RunSpec],
    fn_path: str,
    out: Path,
    jobs: int = 1,
    threads: int = 1,
    paper: list[dict] | None = None,
    progress: bool = True,
    executor: executors.Executor | None = None,
    device: str | None = None,
    precision: str | None = None,
) -> dict:
    """Run (or resume) every spec, then write ``results.json``; return the results dict.

    Under ``torchrun`` (see :mod:`masklab.lab.distributed`) every process runs every spec
    in-process, together; only rank 0 writes files. ``executor`` (default: the one the
    CLI chose with :func:`masklab.lab.executors.use`, else local with ``jobs``) runs the specs
    still to do; see :mod:`masklab.lab.executors`. ``device`` / ``precision`` (``auto``, ``cpu``,
    ``cuda``; ``fp32``, ``bf16``, ``fp16``; default: the CLI's ``--device`` / ``--precision``
    chosen with :func:`masklab.util.device.use`, else the CPU in fp32) say where every run computes."""
    if not isinstance(threads, int) or threads < 1:  # every study's --threads, before --out is created
        raise MasklabError(f"--threads must be >= 1, got {threads}")
    if device is not None or precision is not None:
        keep = device is None  # only the precision given: keep the device and how it was chosen
        with devices.using(
            devices.current() if keep else device,
            precision or devices.precision(),
            devices.chosen_by_auto() if keep else None,
        ):
            return run_study(study, config, specs, fn_path, out, jobs, threads, paper, progress, executor)
    # a run function whose module declares no DEVICES computes on the CPU only, no PRECISIONS in fp32 only
    module = sys.modules[resolve(fn_path).__module__]
    fallback = devices.for_study(study, getattr(module, "DEVICES", ("cpu",)))
    if fallback is not None:
        return run_study(study, config, specs, fn_path, out, jobs, threads, paper, progress, executor, device=fallback)
    if devices.precision() not in getattr(module, "PRECISIONS", ("fp32",)):
        raise MasklabError(
            f"{study} computes in fp32 only: its passes do not autocast to {devices.precision()} yet; drop --precision"
        )
    where = devices.describe()
    main = distributed.is_main()
    if distributed.world_size() > 1:
        jobs = 1
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if main:
        write_json(out / "config.json", {"study": study, "config": config})
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise MasklabError("two runs of this study share a task/model/method/seed key")
    code, code_ast = fn_code(fn_path), fn_code_ast(fn_path)
    done: dict[str, dict] = {}
    todo: list[RunSpec] = []
    for s in specs:
        path = out / "runs" / f"{s.key}.json"
        if path.exists():
            rec = read_json(path)
            same_place = (
                rec.get("device", "cpu") == where["device"] and rec.get("precision", "fp32") == where["precision"]
            )
            # by code_ast (comments, docstrings, formatting aside); a record older than it by code
            same_code = rec["code_ast"] == code_ast if "code_ast" in rec else rec.get("code") == code
            if rec.get("spec") == s.as_dict() and (KEEP_OLD_RUNS or (same_code and same_place)):
                done[s.key] = rec
                continue
        todo.append(s)
    if main:
        for s in todo:
            claim_checkpoint(out / "ckpt" / s.key, code_ast, also=code)
    distributed.barrier()  # every rank has decided what to resume before anyone writes
    if executor is None:
        executor = (
            executors.current(jobs, write=main)
            if distributed.world_size() == 1
            else executors.LocalExecutor(1, write=main)
        )
    bar = tqdm(
        total=len(specs), initial=len(done), desc=study, unit="run", disable=not (progress and main), file=sys.stderr
    )
    try:
        for key, rec in executor.run(fn_path, todo, out, threads, bar.set_postfix_str):
            done[key] = rec
            bar.update()
    finally:
        bar.close()
    runs = [done[k] for k in keys]
    env = environment()
    env["torch_threads_per_run"] = threads
    env["jobs"] = jobs
    env["executor"] = type(executor).__name__
    env["world_size"] = distributed.world_size()
    env.update(where)  # device, device_name, precision
    results = {
        "study": study,
        "config": config,
        "runs": runs,
        "summary": summarize(runs),
        "paper": paper or [],
        "environment": env,
        "code": code_counts(runs),
        "code_ast": code_counts(runs, "code_ast"),
    }
    if main:
        write_json(out / "results.json", results)
    return results
