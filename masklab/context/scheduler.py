"""The worker of ``masklab serve``: one thread runs the model, short requests in batches, long
documents in slices between them.

A request is a :class:`Job`. Its context's size puts it in one of two lanes:

* **short** (under ``--slice-bytes``): the worker takes every waiting short job, up to
  ``--max-batch``, as one batch (when it finds it idle it first waits up to ``--batch-ms`` for
  more); the batch's requests on one document with one router are scored together, the
  document cut into units once and its questions read by one :meth:`Router.read
  <masklab.context.router.Router.read>` call (for the pruners: one encoder pass over the
  questions), then each request is finished alone with those scores
  (:func:`batch_scores`, :func:`with_scores`);
* **long**: a generator that does a slice of the work per step (the document cut into units,
  then ``--slice-units`` of its units embedded into the embedder's cache per step; the last
  step prunes it with every vector cached). The worker alternates: one short batch, one long
  step, so a short request waits for at most one slice of a long document, and a long document
  is not starved by a steady stream of short ones.

The model is still used by one thread only. A job past its deadline or whose client is gone
is dropped before its batch runs or before its next slice. Every job records how long the
worker worked on it (its batch's time until it was answered, or the sum of its slices'), so
``Server-Timing`` can say queue and work; :meth:`Scheduler.lanes` says what is in flight in each
lane (``GET /healthz``).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from masklab.text.document import Document, segment

LANES = ("short", "long")


class Dropped(Exception):
    """A request dropped unrun (past its time, or its client gone)."""


class Job:
    """One admitted request: ``request`` (what the runner reads), its context's ``size`` in
    bytes, its ``lane``, ``deadline`` (``time.monotonic()``) and ``gone`` (set when its client
    disconnects). ``future`` gets the result; ``started`` / ``work`` (seconds) its timing;
    ``progress`` a long job's ``(units embedded, units)``."""

    def __init__(self, request, size: int, lane: str, deadline: float, gone: threading.Event | None = None) -> None:
        self.request, self.size, self.lane, self.deadline = request, size, lane, deadline
        self.gone = gone or threading.Event()
        self.future: Future = Future()
        self.arrived = time.monotonic()
        self.started: float | None = None
        self.work = 0.0
        self.steps: Iterator | None = None  # a long job's generator, once started
        self.progress: tuple[int, int] | None = None

    def finish(self, result=None, error: BaseException | None = None) -> None:
        """Hand the caller ``result`` (or ``error``); a short job's ``work`` is its batch's time
        until now (a long job's is counted slice by slice)."""
        if self.lane == "short" and self.started is not None:
            self.work = time.monotonic() - self.started
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class Scheduler:
    """One worker thread running ``run_batch(jobs)`` (finishes each short job: :meth:`Job.finish`) and
    ``run_long(job)`` (a generator: yields between slices, returns the result) as the module
    docstring says. ``counts`` gets ``timed_out`` / ``disconnected`` for the jobs dropped;
    ``trim()`` runs after every step (the allocator's free memory back to the system)."""

    def __init__(
        self,
        run_batch: Callable[[list[Job]], None],
        run_long: Callable[[Job], Iterator],
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
        self.running: list[Job] = []
        self.work_seconds = 1.0  # a running mean of one request's share of the work (the Retry-After estimate)
        self.batches = 0
        self.batched_requests = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="masklab-model", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the callers' side
    def submit(self, job: Job) -> Future:
        with self._cond:
            (self.long if job.lane == "long" else self.short).append(job)
            self._cond.notify()
        return job.future

    def call(self, fn: Callable, *args) -> Future:
        """``fn(*args)`` on the worker thread (before the next batch): loading a router, setting
        torch's threads."""
        fut: Future = Future()
        with self._cond:
            self.calls.append((fn, args, fut))
            self._cond.notify()
        return fut

    def lanes(self) -> dict:
        """What is in flight per lane: requests (waiting and running), their bytes, and each long
        job's units embedded so far (``GET /healthz``)."""
        with self._cond:
            jobs = [*self.short, *self.long, *self.running]
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

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left = [*self.short, *self.long]
            self.short.clear()
            self.long.clear()
            self._cond.notify()
        for job in left:
            job.future.cancel()

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
                jobs = [self.short.popleft() for _ in range(min(self.max_batch, len(self.short)))]
                self.running = jobs
                return ("batch", jobs)
            job = self.long[0]
            self.running = [job]
            return ("long", job)

    def _live(self, job: Job) -> bool:
        """False (and the job dropped) when it is past its deadline or its client is gone."""
        why = "timed_out" if time.monotonic() > job.deadline else "disconnected" if job.gone.is_set() else None
        if why is None:
            return True
        self.counts[why] += 1
        if job.steps is not None:
            job.steps.close()
        if job.lane == "long" and self.long and self.long[0] is job:
            self.long.popleft()
        job.finish(error=Dropped(why))
        return False

    def _loop(self) -> None:
        long_turn = False
        while (task := self._next(long_turn)) is not None:
            kind, what = task
            t0 = time.monotonic()
            try:
                if kind == "call":
                    fn, args, fut = what
                    try:
                        fut.set_result(fn(*args))
                    except BaseException as e:  # noqa: BLE001  (handed to the caller)
                        fut.set_exception(e)
                    continue
                if kind == "batch":
                    jobs = [j for j in what if self._live(j)]
                    for j in jobs:
                        j.started = t0
                    failed = None
                    if jobs:
                        try:
                            self.run_batch(jobs)
                        except Exception as e:  # noqa: BLE001  (a bug: its requests get it, the worker goes on)
                            failed = e
                        self.batches += 1
                        self.batched_requests += len(jobs)
                    took = time.monotonic() - t0
                    for j in jobs:
                        if not j.future.done():  # (never hang a client)
                            j.finish(error=failed or RuntimeError("the batch left this request unanswered"))
                    if jobs:
                        self.work_seconds = 0.9 * self.work_seconds + 0.1 * took / len(jobs)
                    long_turn = True
                else:
                    self._step(what, t0)
                    long_turn = False
            finally:
                with self._cond:
                    self.running = []
                if self.trim is not None:
                    self.trim()

    def _step(self, job: Job, t0: float) -> None:
        """One slice of a long job; its result once its generator returns."""
        if not self._live(job):
            return
        if job.steps is None:
            job.started = t0
            job.steps = self.run_long(job)
        done, result, error = False, None, None
        try:
            next(job.steps)
        except StopIteration as stop:
            done, result = True, stop.value
        except Exception as e:  # noqa: BLE001  (the request's error, handed to its caller)
            done, error = True, e
        job.work += time.monotonic() - t0
        if done:
            with self._cond:
                self.long.popleft()
            self.work_seconds = 0.9 * self.work_seconds + 0.1 * job.work
            job.finish(result, error)


# --------------------------------------------------------------------------- batching across requests
def batch_scores(router, docs: dict[str, object], questions: dict[str, list[str]]) -> dict[str, tuple]:
    """For each document (``docs``: text -> its :class:`~masklab.text.document.Document`) asked
    two or more ``questions``, ``(scores by question, the read's Scores)`` from one
    :meth:`~masklab.context.router.Router.read` call: the batch's scoring. A document whose scoring
    fails is left out (its requests then score it themselves and report their own error)."""
    out = {}
    for text, doc in docs.items():
        qs = list(dict.fromkeys(questions.get(text, [])))
        if len(qs) < 2 or not doc.units:
            continue
        try:
            read = router.read(doc, qs)
        except Exception:  # noqa: BLE001  (each request meets it again alone, with its own message)
            continue
        out[text] = (dict(zip(qs, read.values)), read)
    return out


def with_scores(router, doc, scores: dict, read):
    """A shallow copy of ``router`` whose :meth:`~masklab.context.router.Router.read` returns the
    batch's ``scores`` for ``doc`` (with the batch ``read``'s windows and notes; any other document
    or question, a second hop's included: the router's own), so the rest of a request (selection,
    budget, notes) runs the router's own code on them."""
    from masklab.context.router import Scores

    proxy = copy.copy(router)

    def read_batch(d, questions):
        if d is doc and all(q in scores for q in questions):
            return Scores([scores[q] for q in questions], read.windows, read.notes)
        return router.read(d, questions)

    proxy.read = read_batch
    return proxy


def embedders_of(router, depth: int = 3) -> list:
    """The :class:`~masklab.context.embedder.Embedder` objects ``router`` reads unit vectors from
    (on it or the models it holds: pruner-ctx's pruner, the pruner's model, dense, the fused
    routers' parts): where a long document is embedded in slices. Empty for the routers that
    embed nothing (bm25, lexical, the evidence router), which score a long document in one step."""
    from masklab.context.embedder import Embedder

    found, seen = [], set()

    def walk(obj, left):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Embedder):
            found.append(obj)
            return
        if left == 0 or not hasattr(obj, "__dict__"):
            return
        for name, value in vars(obj).items():
            if name != "lm" and not name.startswith("_"):
                walk(value, left - 1)

    walk(router, depth)
    return found


class CutOnce(Document):
    """A :class:`~masklab.text.document.Document` whose token counts per unit are counted once
    per tokenizer (:func:`cut`)."""

    def lengths(self, tokenizer) -> list[int]:
        if not hasattr(self, "_lengths"):
            self._lengths = {}
        if id(tokenizer) not in self._lengths:
            self._lengths[id(tokenizer)] = super().lengths(tokenizer)
        return list(self._lengths[id(tokenizer)])


def cut(text: str, tokenizer, unit_tokens: int) -> CutOnce:
    """``text`` cut into units (:func:`~masklab.text.document.segment`) as a :class:`CutOnce`:
    the batch's requests on one document, and a long document's last step, each read its token
    counts twice (the budget and the selection), and counting is most of what a request costs
    once its document is embedded."""
    doc = segment(text, tokenizer, unit_tokens)
    return CutOnce(units=doc.units, gold=doc.gold, spans=doc.spans, source=doc.source)
