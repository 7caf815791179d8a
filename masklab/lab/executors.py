"""Where a study's runs execute: this machine (``local``) or a Ray cluster (``ray``).

:func:`masklab.lab.runner.run_study` decides which runs still need doing (resume), hands them
to an executor and gathers the records it yields; the executor only executes. Both
executors share one interface::

    executor.run(fn_path, todo, out, threads, show) -> Iterator[(key, record)]

It runs every spec in ``todo`` with :func:`masklab.lab.runs.execute` on the device and precision
chosen with :func:`masklab.util.device.use` (passed to each worker and task), writes
``out/runs/<key>.json`` as each run finishes and yields ``(key, record)``; ``show(text)``
puts the current run names on the progress bar. On a failed run it raises
:class:`MasklabError` after keeping every finished run's file.

* :class:`LocalExecutor`: ``jobs=1`` runs in this process; ``jobs>1`` runs at most
  ``jobs`` worker subprocesses (``python -m masklab.lab.worker``; JSON in, JSON out).
* :class:`RayExecutor`: each spec is one Ray task with ``num_cpus`` = the run's torch
  threads (or its ``cpus`` param when larger), and ``num_gpus=1`` when the runs compute on
  CUDA (``--device``). The task writes the run's file itself, so
  ``out`` must be storage every node sees at the same path; this is checked on every node
  before any run starts. A task whose worker dies is retried by Ray (``max_retries``) and
  continues from the run's checkpoint; a run that raises is not retried. Only JSON-able
  dicts and strings cross Ray: the spec goes in as a dict, the record comes back as JSON
  text, so nothing but plain data is serialised.

The CLI picks the executor once (``--executor``, ``--ray-address``) with :func:`use`;
studies call ``run_study`` unchanged and the runner asks :func:`current` for it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Callable, Iterator, Protocol

from masklab.util import device as devices
from masklab.util.errors import MasklabError
from masklab.util.files import json_default, read_json, write_json
from masklab.lab.runs import RunSpec, execute

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'masklab[ray]'  (or: pip install 'ray==2.60.0')"


class Executor(Protocol):
    def run(
        self, fn_path: str, todo: list[RunSpec], out: Path, threads: int, show: Callable[[str], None]
    ) -> Iterator[tuple[str, dict]]: ...


# ----------------------------------------------------------------------------- choice


_CHOICE: dict = {"kind": "local", "address": None}


def use(kind: str, address: str | None = None) -> None:
    """Set the executor every following ``run_study`` uses (the CLI's ``--executor``)."""
    if kind not in EXECUTORS:
        raise MasklabError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")
    if address is not None and kind != "ray":
        raise MasklabError("--ray-address needs --executor ray")
    if kind == "ray":
        import_ray()  # fail now, with the install command, not after the first study starts
    _CHOICE.update(kind=kind, address=address)


def current(jobs: int, write: bool = True) -> Executor:
    """The executor chosen with :func:`use` (``jobs`` sizes the local one)."""
    if _CHOICE["kind"] == "ray":
        return RayExecutor(_CHOICE["address"])
    return LocalExecutor(jobs, write)


# ----------------------------------------------------------------------------- local


def _last_line(e: BaseException) -> str:
    """A run's error as one line: a :class:`MasklabError`'s message, else ``Type: message``."""
    if isinstance(e, MasklabError):
        return str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return traceback.format_exception_only(e)[-1].strip()


def failure_message(key: str, line: str, log: Path | None, out: Path) -> str:
    """The one line every local run failure gives, in-process or in a worker."""
    where = f"its log: {log}; " if log is not None else ""
    return f"a run failed: {key}: {line} ({where}finished runs are kept in {out / 'runs'})"


class LocalExecutor:
    """In this process (``jobs <= 1``) or in ``jobs`` worker subprocesses.

    ``write=False`` (a non-zero rank under torchrun) runs in-process without writing files.
    """

    def __init__(self, jobs: int = 1, write: bool = True) -> None:
        self.jobs = jobs
        self.write = write

    def run(
        self, fn_path: str, todo: list[RunSpec], out: Path, threads: int, show: Callable[[str], None]
    ) -> Iterator[tuple[str, dict]]:
        if self.jobs <= 1:
            for s in todo:
                show(s.key)
                rec = self._in_process(fn_path, s, out, threads)
                if self.write:
                    write_json(out / "runs" / f"{s.key}.json", rec)
                yield s.key, rec
        else:
            yield from self._parallel(fn_path, todo, out, threads, show)

    def _in_process(self, fn_path: str, s: RunSpec, out: Path, threads: int) -> dict:
        """One run in this process; a run that raises is reported as a worker's failure is:
        one line and the path of its log (which holds the traceback), never a traceback."""
        try:
            return execute(fn_path, s.as_dict(), out / "ckpt" / s.key, threads)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 (every failure of a run becomes one line + its log)
            log = out / "ckpt" / s.key / "stderr.log"
            text = "".join(traceback.format_exception(e)) if not isinstance(e, MasklabError) else f"{e}\n"
            try:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(text)
            except OSError:
                log = None
            raise MasklabError(failure_message(s.key, _last_line(e), log, out)) from None

    def _parallel(
        self, fn_path: str, todo: list[RunSpec], out: Path, threads: int, show: Callable[[str], None]
    ) -> Iterator[tuple[str, dict]]:
        queue = list(todo)
        active: dict[str, subprocess.Popen] = {}
        failure: str | None = None
        try:
            while queue or active:
                while queue and len(active) < self.jobs and failure is None:
                    s = queue.pop(0)
                    spec_path = out / "ckpt" / s.key / "spec.json"
                    write_json(spec_path, s.as_dict())
                    cmd = [
                        sys.executable,
                        "-m",
                        "masklab.lab.worker",
                        fn_path,
                        str(spec_path),
                        str(out / "runs" / f"{s.key}.json"),
                        str(threads),
                        str(devices.current()),
                        devices.precision(),
                    ]
                    with open(out / "ckpt" / s.key / "stderr.log", "w") as log:
                        active[s.key] = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL)
                    show(", ".join(active))
                if failure is not None and not active:
                    break
                time.sleep(0.05)
                for key, proc in list(active.items()):
                    if proc.poll() is None:
                        continue
                    del active[key]
                    if proc.returncode != 0:
                        log = out / "ckpt" / key / "stderr.log"
                        err = log.read_text()
                        failure = failure or failure_message(
                            key, (err.strip().splitlines() or [f"worker exited {proc.returncode}"])[-1], log, out
                        )
                        continue
                    show(", ".join(active) or key)
                    yield key, read_json(out / "runs" / f"{key}.json")
        finally:
            for proc in active.values():
                proc.kill()
        if failure is not None:
            raise MasklabError(failure)


# ----------------------------------------------------------------------------- ray


def import_ray():
    """Import Ray, or say how to install it."""
    try:
        import ray  # noqa: PLC0415 (optional dependency)
    except ImportError:
        raise MasklabError(
            f"--executor ray needs Ray, which is not installed; install it with: {RAY_INSTALL}"
        ) from None
    return ray


def _ray_task(fn_path: str, spec: dict, out: str, threads: int, device: str = "cpu", precision: str = "fp32") -> str:
    """One run on a Ray worker: execute, write ``runs/<key>.json``, return the record as JSON text."""
    key = RunSpec(**spec).key
    rec = execute(
        fn_path, spec, Path(out) / "ckpt" / key, threads, device, precision
    )  # sets torch's threads and device
    write_json(Path(out) / "runs" / f"{key}.json", rec)
    return json.dumps(rec, default=json_default)


def _ray_probe(out: str, token_name: str, token: str) -> str:
    """On one node: can it read the driver's token file in ``out`` and write beside it?"""
    host = socket.gethostname()
    path = Path(out) / token_name
    try:
        seen = path.read_text()
    except OSError as e:
        return f"{host}: cannot read {path} ({e.strerror or e})"
    if seen != token:
        return f"{host}: {path} holds another file than the driver wrote"
    try:
        write_json(Path(out) / f"{token_name}.{host}.{os.getpid()}", {"host": host})
    except OSError as e:
        return f"{host}: cannot write to {out} ({e.strerror or e})"
    return ""


def _check_reachable(address: str) -> None:
    """Fail fast on ``HOST:PORT`` nobody listens on (``ray.init`` would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise MasklabError(f"--ray-address takes HOST:PORT (e.g. 10.0.0.1:6379) or auto, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise MasklabError(
            f"cannot connect to the Ray cluster at {address!r} ({e.strerror or e}); start its head with "
            "`ray start --head --port=PORT` or pass --ray-address auto on a cluster node"
        ) from None


class RayExecutor:
    """One Ray task per run on the cluster at ``address`` (``None``: the running local
    cluster, or a new one on this machine; ``"auto"``: an existing cluster only)."""

    def __init__(self, address: str | None = None, max_retries: int = 3) -> None:
        self.address = address
        self.max_retries = max_retries

    def connect(self):
        ray = import_ray()
        if self.address not in (None, "auto") and not self.address.startswith("ray://"):
            _check_reachable(self.address)
        if ray.is_initialized():
            if getattr(self, "_connected", False):
                return ray
            ray.shutdown()
        try:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            where = (
                "an existing Ray cluster (--ray-address auto)"
                if self.address == "auto"
                else f"the Ray cluster at {self.address!r}"
            )
            if self.address is None:
                where = "a local Ray cluster"
            raise MasklabError(
                f"cannot connect to {where}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}. "
                "Start one with `ray start --head --port=6379` and pass --ray-address HEAD_IP:6379 "
                "(or auto on a cluster node)"
            ) from None
        self._connected = True
        return ray

    def check_shared(self, ray, out: Path) -> None:
        """Every alive node must see ``out``: read a file the driver wrote and write one."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

        name = f".masklab-shared-{uuid.uuid4().hex[:12]}"
        token = uuid.uuid4().hex
        (out / name).write_text(token)
        try:
            probe = ray.remote(_ray_probe)
            nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
            refs = [
                probe.options(
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(str(out), name, token)
                for n in nodes
            ]
            problems = [p for p in ray.get(refs) if p]
        finally:
            for f in out.glob(f"{name}*"):
                f.unlink(missing_ok=True)
        if problems:
            raise MasklabError(
                f"the output directory {out} is not shared with every Ray node: {'; '.join(problems)}. "
                "On a multi-node cluster --out must be on storage mounted at the same path on every node "
                "(NFS, Lustre, ...)"
            )

    def run(
        self, fn_path: str, todo: list[RunSpec], out: Path, threads: int, show: Callable[[str], None]
    ) -> Iterator[tuple[str, dict]]:
        if not todo:  # everything resumed: no cluster needed
            return
        ray = self.connect()
        out = Path(out).resolve()
        self.check_shared(ray, out)
        task = ray.remote(_ray_task)
        keys: dict = {}
        for s in todo:
            cpus = max(threads, int(s.params.get("cpus", 1)))
            gpus = 1 if devices.current().type == "cuda" else 0  # a CUDA run asks Ray for one GPU
            ref = task.options(
                num_cpus=cpus,
                num_gpus=gpus,
                max_retries=self.max_retries,
                retry_exceptions=False,
                name=f"masklab:{s.key}",
            ).remote(fn_path, s.as_dict(), str(out), threads, "cuda" if gpus else "cpu", devices.precision())
            keys[ref] = s.key
        pending = list(keys)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for ref in ready:
                    key = keys[ref]
                    try:
                        text = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        cause = getattr(e, "cause", None)
                        msg = str(cause) if isinstance(cause, Exception) else str(e).strip().splitlines()[-1]
                        raise MasklabError(
                            f"a run failed: {key}: {msg} (finished runs are kept in {out / 'runs'})"
                        ) from None
                    except ray.exceptions.RayError as e:
                        raise MasklabError(
                            f"a run failed: {key}: {type(e).__name__} after {self.max_retries} retries "
                            f"(finished runs are kept in {out / 'runs'}; run the same command again to resume)"
                        ) from None
                    show(f"{key} (+{len(pending)} queued or running)" if pending else key)
                    yield key, json.loads(text)
        finally:
            for ref in pending:
                ray.cancel(ref)
