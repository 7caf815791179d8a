"""``masklab serve``: ``masklab compress`` as an HTTP JSON service (FastAPI + uvicorn).

    masklab serve --model smollm2-135m --router bm25 --port 8000
    curl -s localhost:8000/v1/compress -d '{"context": "...", "question": "Who approved the budget?"}'

The model (and each router, once, the first time a request names it) is loaded once, so a
request costs what pruning costs, not a process start and a model load. ``POST
/v1/compress`` takes ``{context: str | [str], question, router?, keep?, target_tokens?,
threshold?, answer?, max_new_tokens?}`` and returns the fields ``masklab compress --json`` prints (with
the answer when ``answer`` is true); ``GET /healthz`` says the service is up. Every request
is checked in the event loop before it waits for the model (:func:`parse_request`, with
:mod:`masklab.text.inputs`' checks and messages): bad input is a 4xx ``{"error": "..."}`` at once.
The model and the routers are used by one worker thread only (:mod:`masklab.context.scheduler`):
concurrent short requests run on it in batches (those on one document with one router scored
in one pass) and a long document (``--slice-bytes``) in slices between them; a request not
answered within ``--request-seconds`` (queue wait included) gets a 503, and one still waiting
in the queue then is dropped unrun (a long one: before its next slice). ``--ray`` deploys the
same app on Ray Serve replicas (:mod:`masklab.context.ray_serve`).

Bounds, so a long run holds its memory and its latency: at most ``--max-queue`` requests
are admitted at once (running and waiting; one more is a 503 with ``Retry-After`` at once,
before it is queued); a request whose client disconnects before the worker reaches it is
dropped unrun; the embedders' caches hold at most ``--cache-documents`` documents and
``--cache-mb`` MiB of vectors each, at most ``--max-routers`` routers stay loaded (least
recently used out), and after each batch or slice the worker hands the C allocator's free
memory back to the system (``malloc_trim``, ``--no-trim`` to leave it: glibc otherwise keeps the
freed buffers of each document's encoder pass, and the resident memory creeps up with
every new document; docs/context.md). ``GET /healthz`` reports every cache's size and
limit, the queue (in flight per lane), the batches and the resident memory. Every response
says how long it waited and ran
(``Server-Timing: queue;dur=..., work;dur=...``, milliseconds).
"""

import argparse
import asyncio
import ctypes
import ctypes.util
import dataclasses
import json
import math
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

from masklab.context.compress import MAX_NEW_TOKENS, SharedFlags
from masklab.context.router import Request
from masklab.context.slices import read_in_slices
from masklab.context.scheduler import Dropped, Job, Scheduler
from masklab.util.errors import MasklabError
from masklab.util.flags import add_flags, check_ranges, config_from_args, flag

FIELD_HELP = {  # the fields of a POST /v1/compress body (serve --help, docs/context.md's table: a test checks both)
    "context": "the document (a string) or several passages (a list of strings), pruned within one budget",
    "question": "the question the kept text must answer",
    "router": "a router name (default: --router)",
    "keep": 'a fraction in (0, 1] of the context\'s tokens, or "auto" (default: --keep)',
    "target_tokens": "keep at most this many tokens instead (wins over keep)",
    "threshold": "keep the units scoring at least it and no other (a router that decides how much; wins over keep)",
    "answer": "true: also answer from the pruned text (default false)",
    "max_new_tokens": f"longest answer in tokens, at most {MAX_NEW_TOKENS} (default: --max-new-tokens)",
}
FIELDS = tuple(FIELD_HELP)


@dataclass
class ServeConfig(SharedFlags):
    host: str = flag(
        "127.0.0.1",
        help="address to listen on (0.0.0.0: every interface; the service has no "
        "authentication, so expose it only behind one)",
    )
    port: int = flag(8000, min=1, max=65535, help="TCP port to listen on")
    max_request_bytes: int = flag(4_000_000, min=1, help="refuse request bodies larger than this (413)")
    request_seconds: float = flag(
        60.0,
        above=0,
        help="answer 503 to a request not done within this many seconds of its arrival (waiting in the queue included)",
    )
    max_queue: int = flag(
        16,
        min=1,
        help="requests admitted at once, running and waiting for the worker; one more "
        "is answered 503 with Retry-After at once",
    )
    cache_documents: int = flag(
        256, min=0, help="documents whose unit embeddings each embedder keeps (least recently used out; 0: none)"
    )
    cache_mb: float = flag(256.0, min=0, help="MiB of cached unit embeddings per embedder (least recently used out)")
    max_routers: int = flag(
        4, min=1, help="routers kept loaded (least recently used out; the default router counts as one)"
    )
    trim: bool = flag(
        True,
        help="after each batch or slice of work, return the C allocator's free memory to the "
        "system (glibc malloc_trim; --no-trim: keep it)",
    )
    batch_ms: float = flag(
        2.0,
        min=0,
        max=1000,
        help="milliseconds the idle worker waits for more requests to batch "
        "with the first one (0: none; requests that arrive while it works are batched anyway)",
    )
    max_batch: int = flag(
        16,
        min=1,
        help="short requests run together in one batch at most; those on one document "
        "with one router are scored in one pass (1: one request at a time)",
    )
    slice_bytes: int = flag(
        16_384,
        min=1,
        help="a context of at least this many bytes (UTF-8, passages together) is "
        "scored in slices between the short requests' batches, not in one go",
    )
    slice_units: int = flag(
        8,
        min=1,
        help="units of a long document embedded per slice (one encoder pass; "
        "longest units first): what a short request may wait behind it",
    )
    ray: bool = flag(
        False,
        help="deploy on Ray Serve instead (--ray-address, --replicas or --min/--max-replicas; "
        "docs/serve.md); --host/--port are then Ray Serve's HTTP proxy's",
    )
    ray_address: str | None = flag(
        None,
        metavar="HOST:PORT|auto",
        default_text="a new local Ray",
        help="--ray: the Ray cluster to deploy on (auto: the one this node belongs to)",
    )
    replicas: int = flag(
        1,
        min=1,
        help="--ray: replicas of the service (each loads the model and runs its own "
        "worker); ignored with --max-replicas",
    )
    min_replicas: int = flag(1, min=0, help="--ray with --max-replicas: the fewest replicas autoscaling keeps")
    max_replicas: int | None = flag(
        None,
        min=1,
        help="--ray: autoscale between --min-replicas and this many replicas "
        "(on requests in flight per replica; none: a fixed --replicas)",
    )
    replica_cpus: float = flag(1.0, above=0, help="--ray: CPUs Ray reserves per replica (as many as its --threads)")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve masklab compress over HTTP (JSON), the model loaded once",
        description=__doc__.splitlines()[0],
        epilog="POST /v1/compress takes a JSON object with "
        + "; ".join(f"{k}: {v}" for k, v in FIELD_HELP.items())
        + ". It returns what masklab compress --json prints.",
    )
    add_flags(p, ServeConfig)
    p.set_defaults(handler=main)


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class CompressRequest:
    """One checked ``POST /v1/compress`` body: the :class:`~masklab.context.router.Request` and
    whether (and how long) to answer from the pruned text."""

    request: Request
    answer: bool
    max_new_tokens: int

    @property
    def router(self) -> str:
        return self.request.router

    @property
    def question(self) -> str:
        return self.request.question


def _no_constant(name: str):
    raise MasklabError(f"the request body is not valid JSON ({name} is not a JSON number)")


def _number(body: dict, key: str, kind: type, what: str):
    x = body.get(key)
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float) if kind is float else int):
        raise MasklabError(f"{key} must be {what}, got {json.dumps(x)[:40]}")
    return kind(x)


def parse_request(raw: bytes, cfg: ServeConfig) -> CompressRequest:
    """The request body ``raw`` checked, with one :class:`MasklabError` for the first thing
    wrong: not JSON, not an object, an unknown field, a wrong type, a context over
    ``--max-context-bytes``, a KV-cache press (it prunes the cache, not the text), and what
    :class:`~masklab.context.router.Request` refuses (an empty question or context, a context over
    ``--max-context-bytes``, a keep outside (0, 1], an unknown router, a budget the router cannot
    take), each checked once, there."""
    from masklab.context.presses import PRESSES, refuse_press

    body = json_body(raw)
    contexts = body_contexts(body)
    question = body.get("question")
    if question is not None and not isinstance(question, str):
        raise MasklabError("question must be a string")
    router = body.get("router", cfg.router)
    if not isinstance(router, str):
        raise MasklabError("router must be a string (a router name)")
    if router in PRESSES:
        refuse_press(router, "the service returns pruned text, so name a router that prunes the text")
    keep = body.get("keep")
    keep = keep if keep == "auto" else _number(body, "keep", float, 'a number in (0, 1] or "auto"')
    threshold = _number(body, "threshold", float, "a number")
    answer = body.get("answer", False)
    if not isinstance(answer, bool):
        raise MasklabError("answer must be true or false")
    new = _number(body, "max_new_tokens", int, "a whole number")
    new = cfg.max_new_tokens if new is None else new
    if not 1 <= new <= MAX_NEW_TOKENS:
        raise MasklabError(f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {new}")
    req = Request.of(
        question,
        contexts,
        keep=cfg.keep if keep is None else keep,
        target_tokens=body.get("target_tokens"),
        threshold=threshold,
        fill=cfg.fill,
        unit_tokens=cfg.unit_tokens,
        router=router,
        max_bytes=cfg.max_context_bytes,
    )
    return CompressRequest(req, answer, new)


def json_body(raw: bytes) -> dict:
    """The request body: UTF-8 JSON (no NaN), an object of the known :data:`FIELDS`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MasklabError(f"the request body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise MasklabError(
            f"the request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from None
    if not isinstance(body, dict):
        raise MasklabError("the request body must be a JSON object with context and question")
    unknown = [k for k in body if k not in FIELDS]
    if unknown:
        raise MasklabError(f"unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
    return body


def body_contexts(body: dict) -> list[str]:
    """The body's context as a list of passages (their text is checked by the request)."""
    ctx = body.get("context")
    if ctx is None:
        raise MasklabError("context is required (a string, or a list of strings: the passages)")
    if isinstance(ctx, str):
        return [ctx]
    if isinstance(ctx, list) and ctx and all(isinstance(c, str) for c in ctx):
        return ctx
    raise MasklabError("context must be a string or a non-empty list of strings")


# --------------------------------------------------------------------------- the model's worker
class Overloaded(Exception):
    """More than ``--max-queue`` requests at once: answered 503 before it is queued."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


def _malloc_trim():
    """glibc's ``malloc_trim`` (None where the C library has none: musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def rss_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Service:
    """The loaded model ``lm`` and its routers, used by the one worker thread of a
    :class:`~masklab.context.scheduler.Scheduler` only: short requests run in batches, long
    documents in slices between them (:meth:`submit`), so the model is never run by two threads
    at once. Admission (:meth:`admit`) bounds the queue; :meth:`router` keeps at most
    ``--max-routers`` loaded; the embedders' caches get ``--cache-documents`` / ``--cache-mb``."""

    def __init__(self, lm, cfg: ServeConfig, device=None, precision: str = "fp32") -> None:
        from masklab.context import embedder

        self.lm, self.cfg, self.device, self.precision = lm, cfg, device, precision
        self.routers: OrderedDict = OrderedDict()
        self._routers_lock = threading.Lock()
        self.started = time.time()
        self.served = 0
        self.counts = {"overloaded": 0, "timed_out": 0, "disconnected": 0, "routers_evicted": 0}
        self.in_flight = 0  # admitted and not yet finished by the worker (waiting or running)
        self._lock = threading.Lock()
        self.trim = _malloc_trim() if cfg.trim else None
        embedder.set_cache_limits(cfg.cache_documents, int(cfg.cache_mb * 2**20))
        self.scheduler = Scheduler(
            self._run_batch, self._run_long, cfg.batch_ms / 1000, cfg.max_batch, self.counts, trim=self._trim
        )

    def admit(self) -> None:
        """Count one more request in, or :class:`Overloaded` at ``--max-queue``."""
        with self._lock:
            if self.in_flight >= self.cfg.max_queue:
                self.counts["overloaded"] += 1
                raise Overloaded(max(1, math.ceil(self.in_flight * self.scheduler.work_seconds)))
            self.in_flight += 1

    def release(self, _=None) -> None:
        with self._lock:
            self.in_flight -= 1

    def run(self, fn, *args) -> Future:
        """``fn(*args)`` on the worker thread (setting torch's threads, loading a router)."""
        return self.scheduler.call(fn, *args)

    def submit(self, req: CompressRequest, deadline: float, gone: threading.Event | None = None) -> Job:
        """Queue ``req`` for the worker: a :class:`~masklab.context.scheduler.Job` whose future
        gets what ``masklab compress --json`` prints, or :class:`Dropped` when it is past
        ``deadline`` or ``gone`` is set before it runs (a long one: before its next slice)."""
        size = sum(len(c.encode("utf-8")) for c in req.request.passages)
        job = Job(req, size, "long" if size >= self.cfg.slice_bytes else "short", deadline, gone)
        self.scheduler.submit(job)
        return job

    def router(self, name: str):
        """Router ``name``, loaded the first time it is asked for and kept among the
        ``--max-routers`` most recently used (worker thread only; ``routers`` changes under
        ``_routers_lock``, which :meth:`health` reads it under)."""
        with self._routers_lock:
            if name in self.routers:
                self.routers.move_to_end(name)
                return self.routers[name]
        from masklab.context.routers import ROUTERS, load_router

        evicted = False
        while len(self.routers) >= self.cfg.max_routers:
            with self._routers_lock:
                self.routers.popitem(last=False)
            self.counts["routers_evicted"] += 1
            evicted = True
        if evicted:
            clear_model_caches()  # so the evicted router's models are freed, not kept by a cache
        given = {"embedder": self.cfg.embedder, "int8": self.cfg.int8}  # the server's, for the routers that take them
        taken = {k: v for k, v in given.items() if k in ROUTERS[name].options}
        router = load_router(name, self.lm, **taken)
        with self._routers_lock:
            self.routers[name] = router
        return router

    def _compress(self, router, reqs: list[CompressRequest]) -> list:
        """:func:`compress_all` of ``reqs`` with ``router`` in the server's precision (worker thread)."""
        from masklab.util import device as devices

        with devices.autocast(self.device, self.precision):
            outs = compress_all(self.lm, router, reqs)
        self.served += sum(not isinstance(o, BaseException) for o in outs)
        return outs

    def _run_batch(self, jobs: list[Job]) -> None:
        """The short jobs of one batch (worker thread): each router's requests pruned by one
        :func:`compress_all` (one :meth:`~masklab.context.router.Router.prune_all`: the questions on
        one document read together); every job's future gets its result or its error."""
        groups: dict[str, list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.request.router, []).append(job)
        for name, group in groups.items():
            try:
                router = self.router(name)
            except Exception as e:  # noqa: BLE001  (a router that cannot load: its requests' error)
                for job in group:
                    job.finish(error=e)
                continue
            for job, out in zip(group, self._compress(router, [j.request for j in group])):
                job.finish(*((None, out) if isinstance(out, BaseException) else (out, None)))

    def _run_long(self, job: Job, pause) -> dict:
        """A long job (worker thread): each passage cut into units, ``pause()`` after each, then the
        request pruned with its router's read in slices of ``--slice-units`` units, ``pause(done,
        total)`` between them (:func:`~masklab.context.slices.read_in_slices`)."""
        from masklab.text.document import segment

        req = job.request
        router = self.router(req.router)
        docs = []
        for text in req.request.passages:
            docs.append(segment(text, self.lm.tokenizer, req.request.unit_tokens))
            pause()
        cut = dataclasses.replace(req, request=dataclasses.replace(req.request, passages=tuple(docs)))
        with read_in_slices(self.cfg.slice_units, pause):
            (out,) = self._compress(router, [cut])
        if isinstance(out, BaseException):
            raise out
        return out

    def _trim(self) -> None:
        if self.trim is not None:
            self.trim(0)

    def health(self) -> dict:
        """What ``GET /healthz`` says: the model, the loaded routers, every cache's size and
        limit, the queue (in flight per lane), the batches, the drop counts and the resident memory."""
        from masklab.context import embedder
        from masklab.context.routers import pruner

        rss = rss_bytes()
        s = self.scheduler
        with self._routers_lock:
            routers = list(self.routers)
        return {
            "status": "ok",
            "model": self.lm.name,
            "router": self.cfg.router,
            "routers_loaded": routers,
            "pid": os.getpid(),  # which process answered (a replica, under --ray)
            "served": self.served,
            "uptime_seconds": round(time.time() - self.started, 3),
            "rss_bytes": rss,
            "queue": {"in_flight": self.in_flight, "max": self.cfg.max_queue, **s.lanes()},
            "batches": {"batches": s.batches, "requests": s.batched_requests, "max_batch": self.cfg.max_batch},
            "dropped": dict(self.counts),
            "caches": {
                "routers": {"entries": len(routers), "max_entries": self.cfg.max_routers},
                "embeddings": sorted(
                    (e.cache_stats() for e in embedder.live_embedders()), key=lambda c: (c["embedder"], -c["misses"])
                ),
                "embedders_loaded": _lru_stats(embedder.load_embedder),
                "pruners_loaded": _lru_stats(pruner.cached_pruner),
                "documents": {
                    "entries": 0,
                    "max_entries": 0,
                    "note": "not cached: each request's context is cut into units anew",
                },
            },
        }

    def close(self) -> None:
        self.scheduler.close()


def _lru_stats(fn) -> dict:
    info = fn.cache_info()
    return {"entries": info.currsize, "max_entries": info.maxsize, "hits": info.hits, "misses": info.misses}


def clear_model_caches() -> None:
    """Drop the process's caches of loaded models (embedders, pruners and their heads): a router
    that holds one keeps it; one no router holds is freed."""
    from masklab.context import embedder
    from masklab.context.routers import pruner

    embedder.load_embedder.cache_clear()
    pruner.clear_caches()
    import gc

    gc.collect()


def compress_all(lm, router, reqs: list[CompressRequest]) -> list:
    """What ``masklab compress --json`` prints for each of ``reqs`` (:mod:`masklab.context.compress`),
    or the error of that request: each request's passages pruned within one budget by one
    :meth:`~masklab.context.router.Router.prune_all` (the questions on one document read together;
    where it fails, each request again alone, so each meets its own error), and the answer from
    the pruned text when asked. :class:`~masklab.context.scheduler.Dropped` (a long read stopped
    between slices) is raised, not returned."""
    from masklab.context.compress import answer, fit_window, render

    fitted: list = []
    for req in reqs:
        try:
            fitted.append(fit_window(req.request, lm, req.max_new_tokens))
        except Exception as e:  # noqa: BLE001  (this request's error)
            fitted.append(e)
    todo = [k for k, f in enumerate(fitted) if not isinstance(f, BaseException)]
    outs: list = list(fitted)
    try:
        pruned = router.prune_all([fitted[k][0] for k in todo])
    except Dropped:
        raise
    except Exception:  # noqa: BLE001  (each request meets it again alone, with its own message)
        pruned = []
        for k in todo:
            try:
                pruned.append(router.prune(fitted[k][0]))
            except Dropped:
                raise
            except Exception as e:  # noqa: BLE001
                pruned.append(e)
    for k, p in zip(todo, pruned):
        if isinstance(p, BaseException):
            outs[k] = p
            continue
        req = reqs[k]
        try:
            out = render(p, lm, fitted[k][1])
            if req.answer:
                out["answer"], out["answer_seconds"] = answer(lm, out["pruned_text"], req.question, req.max_new_tokens)
        except Exception as e:  # noqa: BLE001
            out = e
        outs[k] = out
    return outs


def compress_request(lm, router, req: CompressRequest, cfg: ServeConfig) -> dict:
    """What ``masklab compress --json`` prints for one request (:func:`compress_all`)."""
    (out,) = compress_all(lm, router, [req])
    if isinstance(out, BaseException):
        raise out
    return out


# --------------------------------------------------------------------------- HTTP
class _TooLarge(Exception):
    pass


async def read_body(request, limit: int) -> bytes:
    """The request's body, or :class:`_TooLarge` past ``limit`` bytes (by its Content-Length
    or while it streams in: a chunked body is counted too). An oversized body is read to its
    end (and dropped) so the client, still sending, reads the 413 rather than a reset."""
    declared = request.headers.get("content-length")
    too_large = declared is not None and declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            too_large = True
        if not too_large:
            chunks.append(chunk)
    if too_large:
        raise _TooLarge
    return b"".join(chunks)


def error(status: int, message: str, **headers):
    """A JSON ``{"error": message}`` response."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def _late(cfg: ServeConfig):
    return error(
        503,
        f"the request did not finish within {cfg.request_seconds:g} s of its arrival "
        "(the server's --request-seconds; queue wait included): retry later",
        **{"Retry-After": "1"},
    )


async def _disconnected(request) -> None:
    """Return when the client of ``request`` (its body read) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # (not expected after the body: never spin)


async def _answer(service: Service, job: Job, request):
    """Wait for ``job`` (until its deadline, or its client gone) and turn it into the response:
    its JSON with ``Server-Timing`` (queue: the time the worker was not working on it; work:
    its batch's time or its slices' sum), or the error."""
    from fastapi.responses import JSONResponse

    result = asyncio.wrap_future(job.future)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {result, watch}, timeout=max(0.0, job.deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:  # the handler cancelled (Ray's proxy past --request-seconds): drop it unrun
        job.gone.set()
        raise
    finally:
        watch.cancel()
    if result not in done:
        job.gone.set()  # the worker drops it before it runs (a long one: before its next slice)
        result.add_done_callback(lambda f: f.cancelled() or f.exception())  # (no "exception never retrieved")
        if watch in done:
            return error(499, "the client disconnected")  # (nobody reads it)
        return _late(service.cfg)
    try:
        out = result.result()
    except Dropped as e:  # the worker reached it just past its deadline, or the server is closing
        if e.why == "closed":
            return error(503, "the server is shutting down: retry on another", **{"Retry-After": "1"})
        return _late(service.cfg)
    except MasklabError as e:  # input only the model can judge (e.g. a document with no units)
        return error(400, str(e))
    total = time.monotonic() - job.arrived
    return JSONResponse(
        out,
        headers={"Server-Timing": f"queue;dur={1000 * max(0.0, total - job.work):.1f}, work;dur={1000 * job.work:.1f}"},
    )


async def compress_endpoint(service: Service, request):
    """``POST /v1/compress``: the body read within ``--max-request-bytes`` and checked in the
    event loop (a 4xx at once), admitted within ``--max-queue``, then queued for the worker."""
    cfg = service.cfg
    deadline = time.monotonic() + cfg.request_seconds
    try:
        body = await read_body(request, cfg.max_request_bytes)
    except _TooLarge:
        return error(
            413,
            f"the request body is over the limit of {cfg.max_request_bytes:,} bytes (the server's --max-request-bytes)",
        )
    try:
        req = parse_request(body, cfg)
    except MasklabError as e:
        return error(400, str(e))
    try:
        service.admit()
    except Overloaded as e:
        return error(
            503,
            f"the server is busy: {cfg.max_queue} requests are already running or waiting (the "
            f"server's --max-queue): retry in {e.retry_after} s",
            **{"Retry-After": str(e.retry_after)},
        )
    job = service.submit(req, deadline)
    job.future.add_done_callback(service.release)  # the slot is freed when the worker is done with it
    return await _answer(service, job, request)


def create_app(service: Service):
    """The FastAPI app of ``service``: ``POST /v1/compress``, ``GET /healthz``; every error a
    JSON ``{"error": "..."}``; its lifespan's shutdown closes ``service``."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from starlette.exceptions import HTTPException

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(service.close)  # the server (uvicorn, or Ray Serve stopping a replica) shuts down

    app = FastAPI(
        title="masklab",
        description="Prune a context to what a question needs.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # unknown path (404), wrong method (405)
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def server_error(request, exc):  # a bug, not bad input: logged by uvicorn, one JSON line to the client
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/healthz")
    async def healthz():
        return service.health()

    @app.post("/v1/compress")
    async def compress(request: Request):  # (annotations evaluated here: FastAPI reads the type)
        return await compress_endpoint(service, request)

    return app


def bind(host: str, port: int):
    """A listening TCP socket on ``host:port``, or one clear error (port in use, bad address)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise MasklabError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise MasklabError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def check_config(cfg: ServeConfig) -> None:
    """Every check of the flags that needs no model: ranges, the prompt format, FastAPI and
    uvicorn installed, the embedder folder, the default router (not a press)."""
    from masklab.pretrained.models import check_models, check_prompt_format

    check_ranges(cfg)
    check_prompt_format(cfg.prompt_format)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MasklabError("masklab serve needs FastAPI and uvicorn: pip install 'masklab[serve]'") from None
    from masklab.context.embedder import check_folder
    from masklab.context.presses import PRESSES, refuse_press
    from masklab.context.router import router_class

    if cfg.embedder:
        check_folder(cfg.embedder)
    if cfg.router in PRESSES:
        refuse_press(cfg.router, "the service returns pruned text, so give a --router that prunes the text")
    router_class(cfg.router)  # an unknown router: the names --list-routers shows
    check_models([cfg.model])
    if cfg.ray:
        from masklab.context.ray_serve import deployment_options

        deployment_options(cfg)  # (the replicas' flags agree: before Ray starts)


def start_service(cfg: ServeConfig, device=None, precision: str = "fp32") -> Service:
    """The model loaded and a :class:`Service` over it, its worker with ``--threads`` torch
    threads and the default router loaded (a router that cannot load fails here)."""
    import torch

    from masklab.pretrained.models import load

    lm = load(cfg.model, threads=cfg.threads, prompt_format=cfg.prompt_format, device=device)
    service = Service(lm, cfg, device, precision)
    try:
        service.run(torch.set_num_threads, cfg.threads).result()
        service.run(service.router, cfg.router).result()
    except BaseException:
        service.close()
        raise
    return service


def replica(flags: dict, device: str, precision: str):
    """``(service, app)`` of one Ray Serve replica (:mod:`masklab.context.ray_serve`): the
    config's ``flags`` as a dict, the device by name."""
    from masklab.util import device as devices

    service = start_service(ServeConfig(**flags), devices.resolve(device), precision)
    return service, create_app(service)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from masklab.util import device as devices

    cfg = config_from_args(args, ServeConfig())
    check_config(cfg)
    dev = devices.resolve(args.device)
    if cfg.ray:
        from masklab.context import ray_serve

        return ray_serve.main(cfg, replica, dev, args.precision)
    sock = bind(cfg.host, cfg.port)  # a port in use is one error before the model loads
    try:
        service = start_service(cfg, dev, args.precision)
        try:
            print(
                f"masklab serve: {service.lm.name} and router {cfg.router} loaded in {service.lm.load_seconds:.1f} s; "
                f"listening on http://{cfg.host}:{cfg.port} (POST /v1/compress, GET /healthz)",
                flush=True,
            )
            server = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning", access_log=False))
            server.run(sockets=[sock])
        finally:
            service.close()
    finally:
        sock.close()
    return 0
