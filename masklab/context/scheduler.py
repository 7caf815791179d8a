"""The worker of ``masklab serve``: one thread runs the model, short requests in batches, long
documents in slices between them.

A request is a :class:`Job`. Its context's size puts it in one of two lanes:

* **short** (under ``--slice-bytes``): the worker takes every waiting short job, up to
  ``--max-batch``, as one batch (when it finds it idle it first waits up to ``--batch-ms`` for
  more) and hands it to ``run_batch``, which prunes each router's requests with one
  :meth:`Router.prune_all <masklab.context.router.Router.prune_all>` call (the questions on one
  document read together);
* **long**: ``run_long(job, pause)`` prunes it with ``pause(done, total)`` as the hook between
  the slices of its read (:func:`~masklab.context.slices.read_in_slices`: ``--slice-units``
  units embedded per slice). At each pause the worker runs one batch of the short jobs waiting,
  so a short request waits for at most one slice of a long document, and a long document is not
  starved by a steady stream of short ones; a long job past its deadline, whose client is gone,
  or whose server is closing ends there (:class:`Dropped`).

The model is still used by one thread only. A job past its deadline or whose client is gone
is dropped before its batch runs or at its next pause. Every job records how long the worker
worked on it (its batch's time until it was answered, or a long job's time less the batches run
at its pauses), so ``Server-Timing`` can say queue and work; :meth:`Scheduler.lanes` says what
is in flight in each lane (``GET /healthz``). :meth:`Scheduler.close` ends the worker: the jobs
waiting and a long job at its next pause get :class:`Dropped` ``("closed")``, a job submitted
after it too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

LANES = ("short", "long")


class Dropped(Exception):
    """A request dropped unrun or between slices: ``why`` is ``timed_out`` (past its time),
    ``disconnected`` (its client gone) or ``closed`` (the server is closing)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Job:
    """One admitted request: ``request`` (what the runner reads), its context's ``size`` in
    bytes, its ``lane``, ``deadline`` (``time.monotonic()``) and ``gone`` (set when its client
    disconnects). ``future`` gets the result; ``started`` / ``work`` (seconds) its timing;
    ``progress`` a long job's ``(units embedded, units)`` of its read so far."""

    def __init__(self, request, size: int, lane: str, deadline: float, gone: threading.Event | None = None) -> None:
        self.request, self.size, self.lane, self.deadline = request, size, lane, deadline
        self.gone = gone or threading.Event()
        self.future: Future = Future()
        self.arrived = time.monotonic()
        self.started: float | None = None
        self.work = 0.0
        self.paused = 0.0  # a long job's seconds spent on short batches at its pauses
        self.progress: tuple[int, int] | None = None

    def dropped(self) -> str | None:
        """Why the job should not run on: ``timed_out``, ``disconnected``, or None."""
        return "timed_out" if time.monotonic() > self.deadline else "disconnected" if self.gone.is_set() else None

    def finish(self, result=None, error: BaseException | None = None) -> None:
        """Hand the caller ``result`` (or ``error``), once; a short job's ``work`` is its batch's
        time until now (a long job's is set by the worker)."""
        if self.future.done():
            return
        if self.lane == "short" and self.started is not None:
            self.work = time.monotonic() - self.started
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class Scheduler:
    """One worker thread running ``run_batch(jobs)`` (finishes each short job: :meth:`Job.finish`) and
    ``run_long(job, pause)`` (returns the long job's result, calling ``pause(done, total)`` between
    slices) as the module docstring says. ``counts`` gets ``timed_out`` / ``disconnected`` for the
    jobs dropped; ``trim()`` runs after every batch, slice and long job (the allocator's free memory
    back to the system). Every queue is read and changed under one lock: the callers' threads submit and
    close, the worker pops."""

    def __init__(
        self,
        run_batch: Callable[[list[Job]], None],
        run_long: Callable[[Job, Callable[[int, int], None]], object],
        batch_seconds: float,
        max_batch: int,
        counts: dict,
        trim: Callable[[], None] | None = None,
    ) -> None:
        self.run_batch, self.run_long = run_batch, run_long
        self.batch_seconds, self.max_batch = batch_seconds, max_batch
        self.counts, self.trim = counts, trim
        self.short: deque[Job] = deque()
        self.long: deque[Job] = deque()
        self.calls: deque[tuple[Callable, tuple, Future]] = deque()
        self.running_short: list[Job] = []
        self.running_long: Job | None = None
        self.work_seconds = 1.0  # a running mean of one request's share of the work (the Retry-After estimate)
        self.batches = 0
        self.batched_requests = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="masklab-model", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the callers' side
    def submit(self, job: Job) -> Future:
        """Queue ``job``; once closed, its future gets :class:`Dropped` ``("closed")`` at once."""
        with self._cond:
            if not self._closed:
                (self.long if job.lane == "long" else self.short).append(job)
                self._cond.notify()
                return job.future
        job.finish(error=Dropped("closed"))
        return job.future

    def call(self, fn: Callable, *args) -> Future:
        """``fn(*args)`` on the worker thread (before the next batch or long job): loading a
        router, setting torch's threads."""
        fut: Future = Future()
        with self._cond:
            if not self._closed:
                self.calls.append((fn, args, fut))
                self._cond.notify()
                return fut
        fut.set_exception(Dropped("closed"))
        return fut

    def lanes(self) -> dict:
        """What is in flight per lane: requests (waiting and running), their bytes, and each long
        job's units embedded so far (``GET /healthz``)."""
        with self._cond:
            jobs = [*self.short, *self.long, *self.running_short]
            if self.running_long is not None:
                jobs.append(self.running_long)
        out = {}
        for lane in LANES:
            mine = [j for j in jobs if j.lane == lane]
            out[lane] = {"in_flight": len(mine), "bytes": sum(j.size for j in mine)}
        out["long"]["slices"] = [
            {"bytes": j.size, "units_embedded": j.progress[0], "units": j.progress[1]}
            for j in jobs
            if j.lane == "long" and j.progress is not None
        ]
        return out

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker: every job waiting gets :class:`Dropped` ``("closed")``, a running batch
        finishes, a long job stops at its next pause; returns once the worker has ended (or after
        ``timeout`` seconds)."""
        with self._cond:
            self._closed = True
            left = [*self.short, *self.long]
            calls = list(self.calls)
            self.short.clear()
            self.long.clear()
            self.calls.clear()
            self._cond.notify_all()
        for job in left:
            job.finish(error=Dropped("closed"))
        for _, _, fut in calls:
            fut.set_exception(Dropped("closed"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    # ---------------------------------------------------------------- the worker's side
    def _next(self, long_turn: bool):
        """The next thing to do: ``("call", ...)``, ``("batch", jobs)``, ``("long", job)`` or
        None when closed. Waits for work, and up to ``batch_seconds`` for a batch to fill."""
        with self._cond:
            while not (self.calls or self.short or self.long or self._closed):
                self._cond.wait()
            if self._closed:
                return None
            if self.calls:
                return ("call", self.calls.popleft())
            if self.short and not (long_turn and self.long):
                first = self.short[0].arrived  # the window runs from the oldest's arrival: no wait once it has waited
                while len(self.short) < self.max_batch and not self._closed:
                    left = first + self.batch_seconds - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                return ("batch", self._take_short())
            self.running_long = self.long.popleft()
            return ("long", self.running_long)

    def _take_short(self) -> list[Job]:
        """Pop a batch of waiting short jobs (hold the lock)."""
        jobs = [self.short.popleft() for _ in range(min(self.max_batch, len(self.short)))]
        self.running_short = jobs
        return jobs

    def _live(self, job: Job) -> bool:
        """False (and the job dropped) when it is past its deadline or its client is gone."""
        why = job.dropped()
        if why is None:
            return True
        self.counts[why] += 1
        job.finish(error=Dropped(why))
        return False

    def _loop(self) -> None:
        long_turn = False
        while (task := self._next(long_turn)) is not None:
            kind, what = task
            try:
                if kind == "call":
                    fn, args, fut = what
                    try:
                        fut.set_result(fn(*args))
                    except BaseException as e:  # noqa: BLE001  (handed to the caller)
                        fut.set_exception(e)
                    continue
                if kind == "batch":
                    self._batch(what)
                    long_turn = True
                else:
                    self._long(what)
                    long_turn = False
            finally:
                with self._cond:
                    self.running_short, self.running_long = [], None
                if self.trim is not None:
                    self.trim()

    def _batch(self, jobs: list[Job]) -> None:
        """One batch of short jobs: those still live run together, each finished."""
        t0 = time.monotonic()
        jobs = [j for j in jobs if self._live(j)]
        if not jobs:
            return
        for j in jobs:
            j.started = t0
        failed = None
        try:
            self.run_batch(jobs)
        except Exception as e:  # noqa: BLE001  (a bug: its requests get it, the worker goes on)
            failed = e
        self.batches += 1
        self.batched_requests += len(jobs)
        for j in jobs:
            if not j.future.done():  # (never hang a client)
                j.finish(error=failed or RuntimeError("the batch left this request unanswered"))
        self.work_seconds = 0.9 * self.work_seconds + 0.1 * (time.monotonic() - t0) / len(jobs)

    def _long(self, job: Job) -> None:
        """A long job, run whole with :meth:`_pause` between its slices."""
        t0 = time.monotonic()
        if not self._live(job):
            return
        job.started = t0
        result, error = None, None
        try:
            result = self.run_long(job, lambda done=0, total=0: self._pause(job, done, total))
        except Exception as e:  # noqa: BLE001  (the request's error, or Dropped: handed to its caller)
            error = e
        job.work = time.monotonic() - t0 - job.paused
        self.work_seconds = 0.9 * self.work_seconds + 0.1 * job.work
        job.finish(result, error)

    def _pause(self, job: Job, done: int, total: int) -> None:
        """Between two slices of long ``job``: :class:`Dropped` when it should stop (closing, past
        its deadline, its client gone), else one batch of the short jobs waiting (no wait for more), and
        the allocator trimmed."""
        if total:
            job.progress = (done, total)
        if self.closed:
            raise Dropped("closed")
        why = job.dropped()
        if why is not None:
            self.counts[why] += 1
            raise Dropped(why)
        with self._cond:
            jobs = self._take_short()
        t0 = time.monotonic()
        try:
            if jobs:
                self._batch(jobs)
        finally:
            with self._cond:
                self.running_short = []
            if self.trim is not None:
                self.trim()
            job.paused += time.monotonic() - t0
