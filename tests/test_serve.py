"""``masklab serve`` over real HTTP on 127.0.0.1: a tiny random Llama (a saved model folder,
as ``--model /path/to/folder`` loads it) and the bm25 router, the server in a thread of this
process, requests from httpx. The service returns what ``masklab compress --json`` prints,
prunes several passages within one budget, answers every bad request with a 4xx JSON error
and runs the model on one thread however many clients send at once."""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from masklab.context.router import DEFAULT_ROUTER

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402
from conftest import save_tiny_folder  # noqa: E402  (the tiny character-level tokenizer)
from test_compress import ANSWERING, REPORT, TRAVEL  # noqa: E402

from masklab.cli import main  # noqa: E402
from masklab.context import serve  # noqa: E402
from masklab.context.routers import ROUTERS  # noqa: E402  (every product router registered)
from masklab.pretrained.models import load  # noqa: E402

QUESTION = "Who approved the budget?"
UNIT_CHARS = 400  # the tiny tokenizer's tokens are characters: a unit of up to 400 keeps sentences whole


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-llama"), "llama", max_positions=4096)


@pytest.fixture(scope="module")
def server(folder):
    """``(base_url, service)``: the app on a free port, served by uvicorn in a thread."""
    cfg = serve.ServeConfig(
        model=str(folder), max_request_bytes=20_000, max_context_bytes=10_000, unit_tokens=UNIT_CHARS
    )
    service = serve.Service(load(str(folder), threads=1), cfg)
    sock = serve.bind("127.0.0.1", 0)
    srv = uvicorn.Server(uvicorn.Config(serve.create_app(service), log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    yield url, service
    srv.should_exit = True
    thread.join(10)
    service.close()
    sock.close()


def post(url, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{url}/v1/compress", content=data, timeout=60, **kw)


def test_healthz(server):
    url, _ = server
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["router"] == DEFAULT_ROUTER


def test_compress_returns_what_the_cli_prints(server, folder, tmp_path, capsys):
    url, _ = server
    r = post(url, {"context": REPORT, "question": QUESTION, "keep": 0.2})
    assert r.status_code == 200, r.text
    got = r.json()
    path = tmp_path / "report.txt"
    path.write_text(REPORT)
    assert (
        main(
            [
                "compress",
                "--context",
                str(path),
                "--question",
                QUESTION,
                "--keep",
                "0.2",
                "--json",
                "--model",
                str(folder),
                "--device",
                "cpu",
                "--unit-tokens",
                str(UNIT_CHARS),
            ]
        )
        == 0
    )
    cli = json.loads(capsys.readouterr().out)
    assert set(cli) - {"router_seconds"} <= set(got)
    for key in (
        "units",
        "kept",
        "scores",
        "unit_tokens",
        "pruned_text",
        "kept_fraction",
        "context_tokens",
        "model_window",
        "notes",
        "question",
        "router",
        "keep",
    ):
        assert got[key] == pytest.approx(cli[key]) if isinstance(cli[key], float) else got[key] == cli[key], key
    assert ANSWERING in got["pruned_text"] and got["compressed_tokens"] <= 0.2 * got["origin_tokens"]


def test_several_passages_share_one_budget(server):
    url, _ = server
    passages = [TRAVEL, REPORT, "The weather was mild all week. Nobody mentioned any budget at all."]
    r = post(url, {"context": passages, "question": QUESTION, "target_tokens": 250})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [p["index"] for p in got["passages"]] == [0, 1, 2]
    assert got["passages"][1]["rank"] == 0 and ANSWERING in got["passages"][1]["text"]
    assert got["target_tokens"] == 250 and got["compressed_tokens"] <= 250
    assert len(got["units"]) == sum(p["units"] for p in got["passages"]) == len(got["scores"])
    assert [got["units"][i] for i in got["kept"]] and all(got["units"][i] in got["pruned_text"] for i in got["kept"])


def test_answer_is_generated_when_asked(server):
    url, _ = server
    r = post(url, {"context": REPORT, "question": QUESTION, "answer": True, "max_new_tokens": 3})
    assert r.status_code == 200 and isinstance(r.json()["answer"], str) and r.json()["answer_seconds"] > 0
    assert "answer" not in post(url, {"context": REPORT, "question": QUESTION}).json()


@pytest.mark.parametrize(
    "body,status,match",
    [
        ("not json", 400, "not valid JSON"),
        (b"\xff\xfe{}", 400, "not valid UTF-8"),
        ('{"context": "a b", "question": "q", "keep": NaN}', 400, "NaN is not a JSON number"),
        ([REPORT], 400, "must be a JSON object"),
        ({"question": QUESTION}, 400, "context is required"),
        ({"context": REPORT, "question": "  "}, 400, "the question is empty"),
        ({"context": REPORT}, 400, "the question is empty"),
        ({"context": " \n", "question": QUESTION}, 400, "the context is empty"),
        ({"context": ["ok", ""], "question": QUESTION}, 400, "passage 1 of the context is empty"),
        ({"context": [], "question": QUESTION}, 400, "non-empty list of strings"),
        ({"context": ["a", 3], "question": QUESTION}, 400, "non-empty list of strings"),
        ({"context": 5, "question": QUESTION}, 400, "non-empty list of strings"),
        ({"context": "a\x00b", "question": QUESTION}, 400, "looks binary"),
        ('{"context": "a \\ud800 b", "question": "q"}', 400, "lone surrogate"),
        ({"context": "x" * 10_001, "question": QUESTION}, 400, "over the limit of 10,000"),
        ({"context": ["x" * 6000, "y" * 6000], "question": QUESTION}, 400, "over the limit of 10,000"),
        ({"context": REPORT, "question": 7}, 400, "question must be a string"),
        ({"context": REPORT, "question": QUESTION, "keep": 0}, 400, r"keep must be a fraction in \(0, 1\]"),
        ({"context": REPORT, "question": QUESTION, "keep": 1.5}, 400, r"keep must be a fraction in \(0, 1\]"),
        ({"context": REPORT, "question": QUESTION, "keep": "0.5"}, 400, "keep must be a number"),
        ({"context": REPORT, "question": QUESTION, "keep": True}, 400, "keep must be a number"),
        ({"context": REPORT, "question": QUESTION, "target_tokens": 0}, 400, "target_tokens must be at least 1"),
        ({"context": REPORT, "question": QUESTION, "target_tokens": 2.5}, 400, "whole number of tokens"),
        ({"context": REPORT, "question": QUESTION, "router": "nope"}, 400, "unknown router 'nope'; choose from"),
        ({"context": REPORT, "question": QUESTION, "router": ["bm25"]}, 400, "router must be a string"),
        ({"context": REPORT, "question": QUESTION, "router": "snapkv"}, 400, "KV-cache press"),
        ({"context": REPORT, "question": QUESTION, "answer": "yes"}, 400, "answer must be true or false"),
        ({"context": REPORT, "question": QUESTION, "max_new_tokens": 0}, 400, r"max_new_tokens must be in \[1, 512\]"),
        (
            {"context": REPORT, "question": QUESTION, "max_new_tokens": 10**9},
            400,
            r"max_new_tokens must be in \[1, 512\]",
        ),
        ({"context": REPORT, "question": QUESTION, "budget": 3}, 400, "unknown field 'budget'"),
        (
            {"context": REPORT, "question": QUESTION, "router": "bm25", "threshold": 0.5},
            400,
            "decides how much to keep",
        ),
        (
            {"context": REPORT, "question": QUESTION, "router": "pruner-ctx", "threshold": 2},
            400,
            r"must be a number in \[0, 1\]",
        ),
        ({"context": REPORT, "question": QUESTION, "threshold": "high"}, 400, "threshold must be a number"),
        (
            {"context": [REPORT, REPORT], "question": QUESTION, "threshold": 0.5, "target_tokens": 9},
            400,
            "each set the budget",
        ),
        ("x" * 20_001, 413, "over the limit of 20,000 bytes"),
    ],
)
def test_bad_requests_are_4xx_json_errors(server, body, status, match):
    url, _ = server
    r = post(url, body)
    assert r.status_code == status and r.headers["content-type"] == "application/json", r.text
    assert set(r.json()) == {"error"} and re.search(match, r.json()["error"]), r.json()


def test_oversized_chunked_body_wrong_path_and_method(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/compress", content=(b"x" * 1000 for _ in range(50)), timeout=60)  # no Content-Length
    assert r.status_code == 413 and "over the limit" in r.json()["error"]
    assert httpx.get(f"{url}/v1/compress").status_code == 405 and "error" in httpx.get(f"{url}/v1/compress").json()
    assert httpx.get(f"{url}/nope").status_code == 404 and "error" in httpx.get(f"{url}/nope").json()


def test_concurrent_requests_are_all_answered_one_at_a_time_on_the_model(server, monkeypatch):
    url, _ = server
    running, threads, overlaps, answered = [0], set(), [], []
    lock = threading.Lock()
    real = serve.compress_all

    def watched(lm, router, reqs):
        with lock:
            running[0] += 1
            overlaps.append(running[0])
            threads.add(threading.get_ident())
            answered.extend(reqs)
        try:
            time.sleep(0.01)
            return real(lm, router, reqs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(serve, "compress_all", watched)
    questions = [f"Who approved the budget, case {i}?" if i % 4 else "" for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda q: post(url, {"context": REPORT, "question": q, "keep": 0.3}), questions))
    for q, r in zip(questions, responses):
        if q:
            assert r.status_code == 200 and r.json()["question"] == q and ANSWERING in r.json()["pruned_text"]
        else:
            assert r.status_code == 400 and "question is empty" in r.json()["error"]
    assert len(answered) == 18 and max(overlaps) == 1 and len(threads) == 1


def test_a_request_past_its_time_limit_is_503_and_not_run(server, monkeypatch):
    url, service = server
    monkeypatch.setattr(service.cfg, "request_seconds", 1e-6)
    served = service.served
    r = post(url, {"context": REPORT, "question": QUESTION})
    assert r.status_code == 503 and "--request-seconds" in r.json()["error"]
    monkeypatch.undo()
    assert post(url, {"context": REPORT, "question": QUESTION}).status_code == 200  # the queue is not stuck
    assert service.served == served + 1


def test_port_in_use_is_one_error_before_the_model_loads(folder, capsys):
    sock = serve.bind("127.0.0.1", 0)
    try:
        code = main(["serve", "--port", str(sock.getsockname()[1]), "--model", str(folder), "--device", "cpu"])
    finally:
        sock.close()
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("masklab: error: cannot listen on 127.0.0.1:") and err.count("\n") == 1
    code = main(["serve", "--router", "snapkv"])
    assert code == 2 and "KV-cache press" in capsys.readouterr().err


# --------------------------------------------------------------------------- bounds (issue 55)
def health(url):
    r = httpx.get(f"{url}/healthz", timeout=30)
    assert r.status_code == 200
    return r.json()


def test_health_reports_every_cache_with_its_limit(server):
    url, service = server
    assert post(url, {"context": REPORT, "question": QUESTION}).status_code == 200
    h = health(url)
    cfg = service.cfg
    assert h["queue"]["in_flight"] == 0 and h["queue"]["max"] == cfg.max_queue
    assert h["caches"]["routers"] == {"entries": len(service.routers), "max_entries": cfg.max_routers}
    emb = h["caches"]["embeddings"]
    assert emb and all(
        e["max_entries"] == cfg.cache_documents and e["max_bytes"] == int(cfg.cache_mb * 2**20) for e in emb
    )
    assert any(e["entries"] >= 1 and e["bytes"] > 0 for e in emb)  # the pruner's embedder cached REPORT
    for lru in ("embedders_loaded", "pruners_loaded"):
        assert h["caches"][lru]["max_entries"] >= 1 and h["caches"][lru]["entries"] <= h["caches"][lru]["max_entries"]
    assert isinstance(h["rss_bytes"], int) and h["rss_bytes"] > 0
    assert set(h["dropped"]) == {"overloaded", "timed_out", "disconnected", "routers_evicted"}


@pytest.fixture
def cache_limits():
    """Set every embedder's cache limits for one test, then put the defaults back."""
    from masklab.context import embedder

    yield embedder.set_cache_limits
    embedder.set_cache_limits(embedder.CACHE_DOCUMENTS, embedder.CACHE_BYTES)


def _embedding_cache(url):
    from masklab.context.embedder import live_embedders

    used = [e for e in live_embedders() if e.misses]  # the embedder the default router reads
    assert used
    name = used[0].name
    return next(e for e in health(url)["caches"]["embeddings"] if e["embedder"] == name and e["misses"])


def test_the_embedding_cache_holds_at_its_limit_of_documents(server, cache_limits):
    url, _ = server
    cache_limits(3, 2**30)
    before = None
    for i in range(3 + 4):  # 3 + k distinct documents
        r = post(
            url, {"context": f"Note {i}: the budget of unit {i} was approved by Dana. It rained.", "question": QUESTION}
        )
        assert r.status_code == 200, r.text
        got = _embedding_cache(url)
        before = got if before is None else before
        assert got["entries"] <= 3 and got["max_entries"] == 3
    assert got["entries"] == 3 and got["evictions"] >= 4
    cache_limits(1, 2**30)  # a lower limit applies at once
    assert _embedding_cache(url)["entries"] == 1


def test_the_embedding_cache_holds_at_its_limit_of_bytes(server, cache_limits):
    url, _ = server
    one = "The budget of unit {} was approved by Dana on Tuesday."
    post(url, {"context": one.format(-1), "question": QUESTION})
    cache_limits(1, 10**9)  # only that document is left
    per_doc = _embedding_cache(url)["bytes"]
    assert per_doc > 0
    cache_limits(1000, int(2.5 * per_doc))  # room for two one-unit documents
    for i in range(5):
        assert post(url, {"context": one.format(i), "question": QUESTION}).status_code == 200
        got = _embedding_cache(url)
        assert got["bytes"] <= 2.5 * per_doc and got["max_bytes"] == int(2.5 * per_doc)
    assert got["entries"] == 2


def test_loaded_routers_are_bounded(server, monkeypatch):
    url, service = server
    monkeypatch.setattr(service.cfg, "max_routers", 2)
    evicted = service.counts["routers_evicted"]
    for router in ("bm25", "lexical", "bm25", DEFAULT_ROUTER):
        assert post(url, {"context": REPORT, "question": QUESTION, "router": router}).status_code == 200
        assert len(health(url)["routers_loaded"]) <= 2
    h = health(url)
    assert h["routers_loaded"] == ["bm25", DEFAULT_ROUTER] and h["caches"]["routers"]["max_entries"] == 2
    # lexical was loaded during the loop and is gone: at least one eviction, whatever other tests had loaded before
    assert service.counts["routers_evicted"] >= evicted + 1


@pytest.fixture
def slow_worker(monkeypatch):
    """``(started, release, calls)``: compress_all blocks until ``release`` is set."""
    started, release, calls = threading.Event(), threading.Event(), []
    real = serve.compress_all

    def slow(lm, router, reqs):
        calls.extend(r.question for r in reqs)
        started.set()
        release.wait(30)
        return real(lm, router, reqs)

    monkeypatch.setattr(serve, "compress_all", slow)
    yield started, release, calls
    release.set()


def test_over_max_queue_is_503_with_retry_after(server, monkeypatch, slow_worker):
    url, service = server
    started, release, calls = slow_worker
    monkeypatch.setattr(service.cfg, "max_queue", 1)
    overloaded = service.counts["overloaded"]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, url, {"context": REPORT, "question": "Who approved it, first?"})
        assert started.wait(30)
        second = post(url, {"context": REPORT, "question": "Who approved it, second?"})
        assert second.status_code == 503 and "--max-queue" in second.json()["error"]
        assert int(second.headers["retry-after"]) >= 1
        release.set()
        assert first.result().status_code == 200
    assert calls == ["Who approved it, first?"] and service.counts["overloaded"] == overloaded + 1
    for _ in range(100):  # the slot is freed once the worker is done
        if health(url)["queue"]["in_flight"] == 0:
            break
        time.sleep(0.02)
    r = post(url, {"context": REPORT, "question": QUESTION})
    assert r.status_code == 200 and re.fullmatch(r"queue;dur=[\d.]+, work;dur=[\d.]+", r.headers["server-timing"])


def test_a_client_that_disconnects_before_its_turn_is_dropped_unrun(server, slow_worker):
    url, service = server
    started, release, calls = slow_worker
    gone = service.counts["disconnected"]
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, url, {"context": REPORT, "question": "Who approved it, first?"})
        assert started.wait(30)
        with pytest.raises(httpx.TimeoutException):  # queued behind the first; the client gives up
            httpx.post(
                f"{url}/v1/compress", json={"context": REPORT, "question": "Who approved it, gone?"}, timeout=0.3
            )
        time.sleep(0.3)  # the server sees the disconnect
        release.set()
        assert first.result().status_code == 200
    for _ in range(100):
        if service.counts["disconnected"] > gone:
            break
        time.sleep(0.02)
    assert service.counts["disconnected"] == gone + 1 and calls == ["Who approved it, first?"]


def test_a_20_mb_body_is_413_and_the_next_good_request_is_answered(server):
    url, _ = server
    r = post(url, json.dumps({"context": "x " * (10 * 2**20), "question": QUESTION}))
    assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]
    assert post(url, {"context": REPORT, "question": QUESTION}).status_code == 200


def test_the_worker_trims_the_allocator_after_each_request(server, monkeypatch):
    url, service = server
    calls = []
    monkeypatch.setattr(service, "trim", lambda pad: calls.append(pad))
    assert post(url, {"context": REPORT, "question": QUESTION}).status_code == 200
    assert post(url, {"context": REPORT, "question": "  "}).status_code == 400  # refused before the worker
    for _ in range(100):  # (the worker trims once the batch is over, after it answered)
        if calls:
            break
        time.sleep(0.02)
    time.sleep(0.1)
    assert calls == [0]


# --------------------------------------------------------------------------- batches and slices (issue 61)
LONG = (
    "\n\n".join(
        f"Item {i}: the {w} committee met on day {i} and discussed the {w} plan at length."
        for i, w in enumerate(["roof", "garden", "budget", "library", "river", "school"] * 14)
    )
    + "\n\n"
    + REPORT
)
QUESTIONS = [
    "Who approved the budget?",
    "What happened to the roof?",
    "When did the meeting open?",
    "Who will run the reading hour?",
    "What was discussed about the garden plan?",
]


@pytest.fixture
def direct(folder):
    """``make(**flags) -> Service`` (no HTTP) over the tiny model; the embedders' caches are
    emptied first, so each service embeds what it is asked for."""
    from masklab.context.embedder import live_embedders

    made = []

    def make(**flags):
        for e in live_embedders():
            e.clear_cache()
        cfg = serve.ServeConfig(model=str(folder), max_context_bytes=100_000, unit_tokens=UNIT_CHARS, **flags)
        made.append(serve.Service(load(str(folder), threads=1), cfg))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _same(got, want):
    """Every field equal but the timings; the scores to float32 rounding (a batch pads the
    questions to one length, a slice batches the units in its own passes)."""
    assert got.keys() == want.keys()
    for key in got:
        if key == "scores":
            assert got[key] == pytest.approx(want[key], abs=1e-6), key
        elif key not in ("router_seconds", "seconds"):
            assert got[key] == want[key], key


def _held(service):
    """Hold the worker until the returned event is set (what is submitted meanwhile queues)."""
    release = threading.Event()
    service.run(release.wait, 30)
    return release


def test_concurrent_requests_on_one_document_are_scored_in_one_pass_with_the_same_results(direct, monkeypatch):
    one = direct(max_batch=1)
    reqs = [
        serve.parse_request(json.dumps({"context": REPORT, "question": q, "keep": 0.3}).encode(), one.cfg)
        for q in QUESTIONS
    ]
    alone = [one.submit(r, float("inf")).future.result(60) for r in reqs]  # one at a time
    assert one.scheduler.batches == len(reqs)
    service = direct(max_batch=16)
    router = service.run(service.router, DEFAULT_ROUTER).result(60)
    calls = []
    real = router.read
    monkeypatch.setattr(router, "read", lambda doc, qs: calls.append(list(qs)) or real(doc, qs))
    release = _held(service)
    jobs = [service.submit(r, float("inf")) for r in reqs]
    release.set()
    together = [j.future.result(60) for j in jobs]
    assert service.scheduler.batches == 1 and service.scheduler.batched_requests == len(reqs)
    assert calls == [QUESTIONS]  # one pass over every question, none scored again alone
    for got, want in zip(together, alone):
        _same(got, want)
    assert len({json.dumps(g["kept"]) for g in together}) > 1  # (different questions: different units kept)


OTHER = "The weather was mild all week. Nobody mentioned any budget at all. The bus left at noon."
PASSAGES = [LONG[: LONG.index("Item 40:")], LONG[LONG.index("Item 40:") :], TRAVEL]  # a long request, 3 passages


def _body(context, question=QUESTION, **more) -> bytes:
    return json.dumps({"context": context, "question": question, **more}).encode()


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_batch_answers_as_one_request_at_a_time_with_every_router(direct, router):
    """Every product router: a batch (per router one prune_all, the questions on one document read
    together) gives each request's answer alone, a request of several passages and one on another
    document among them."""
    one = direct(max_batch=1)
    bodies = [_body(REPORT, q, router=router, keep=0.3) for q in QUESTIONS[:3]]
    bodies += [_body([TRAVEL, REPORT], QUESTION, router=router, target_tokens=200), _body(TRAVEL, router=router)]
    reqs = [serve.parse_request(b, one.cfg) for b in bodies]
    alone = [one.submit(r, float("inf")).future.result(120) for r in reqs]
    service = direct(max_batch=16)
    release = _held(service)
    jobs = [service.submit(r, float("inf")) for r in reqs]
    release.set()
    together = [j.future.result(120) for j in jobs]
    assert service.scheduler.batches == 1 and service.scheduler.batched_requests == len(reqs)
    for got, want in zip(together, alone):
        _same(got, want)


def _encoded(monkeypatch):
    """Every text any embedder encodes, call by call."""
    from masklab.context.embedder import Embedder

    calls = []
    real = Embedder.encode
    monkeypatch.setattr(Embedder, "encode", lambda self, texts: calls.append(list(texts)) or real(self, texts))
    return calls


def _watch_pauses(service, at_pause):
    """Wrap the scheduler's long jobs: ``at_pause(job, k, done, total)`` runs at the k-th pause."""
    real = service.scheduler.run_long

    def run_long(job, pause):
        count = [0]

        def watched(done=0, total=0):
            count[0] += 1
            at_pause(job, count[0], done, total)
            pause(done, total)

        return real(job, watched)

    service.scheduler.run_long = run_long


@pytest.mark.parametrize("router", [DEFAULT_ROUTER, "pruner-ctx", "dense"])
def test_a_long_request_of_several_passages_is_embedded_once_in_slices_between_short_ones(direct, monkeypatch, router):
    from masklab.context.embedder import live_embedders

    body = _body(PASSAGES, router=router, keep=0.2)
    whole = direct(slice_bytes=10**9)  # never sliced: the reference
    service = direct(slice_bytes=4096, slice_units=16)
    want = whole.submit(serve.parse_request(body, whole.cfg), float("inf")).future.result(120)
    for e in live_embedders():
        e.clear_cache()
    short = serve.parse_request(_body(OTHER, "Who wrote the report?"), service.cfg)
    order, seen = [], []

    def at_pause(job, k, done, total):
        seen.append((done, total))
        if k == 1:  # a short request arrives while the long one is being cut and embedded
            extra = service.submit(short, float("inf"))
            extra.future.add_done_callback(lambda f: order.append("short"))

    _watch_pauses(service, at_pause)
    calls = _encoded(monkeypatch)
    long = service.submit(serve.parse_request(body, service.cfg), float("inf"))
    long.future.add_done_callback(lambda f: order.append("long"))
    assert long.lane == "long"
    got = long.future.result(120)
    _same(got, want)
    assert order == ["short", "long"]
    units = got["units"]
    assert len(units) > 64 and seen[:3] == [(0, 0)] * 3  # each passage cut, then a pause
    slices = [n for n, total in seen[3:] if total == len(units)]
    assert slices == list(range(16, len(units), 16))  # then 16 units a slice, a pause after each but the last
    long_calls = [c for c in calls if set(c) <= set(units)]  # (the questions and the short request's units aside)
    embedded = [u for c in long_calls for u in c]
    assert sorted(embedded) == sorted(units)  # the stacked passages embedded once, a slice at a time
    assert max(len(c) for c in long_calls) <= 16


def test_a_long_document_whose_client_left_is_dropped_between_slices(direct):
    service = direct(slice_bytes=4096, slice_units=32)
    pauses = []

    def at_pause(job, k, done, total):
        pauses.append(k)
        job.gone.set()  # the client disconnects at the first pause

    _watch_pauses(service, at_pause)
    job = service.submit(serve.parse_request(_body(LONG), service.cfg), float("inf"))
    with pytest.raises(serve.Dropped, match="disconnected"):
        job.future.result(60)
    assert pauses == [1] and service.counts["disconnected"] == 1 and service.served == 0


def test_closing_during_a_long_job_ends_it_and_the_requests_waiting(direct):
    service = direct(slice_bytes=4096, slice_units=16)
    short = serve.parse_request(_body(REPORT), service.cfg)
    closer, waiting = [], []

    def at_pause(job, k, done, total):
        if k == 4:  # mid-embedding: a short request waits (it is run at this pause) and the server closes
            waiting.append(service.submit(short, float("inf")))
            closer.append(threading.Thread(target=service.close))
            closer[0].start()
            while not service.scheduler.closed:
                time.sleep(0.001)

    _watch_pauses(service, at_pause)
    long = service.submit(serve.parse_request(_body(PASSAGES), service.cfg), float("inf"))
    with pytest.raises(serve.Dropped, match="closed"):
        long.future.result(60)
    closer[0].join(60)
    assert not closer[0].is_alive() and not service.scheduler._thread.is_alive()
    with pytest.raises(serve.Dropped, match="closed"):  # closed before its batch ran: dropped, not hung
        waiting[0].future.result(0)
    after = service.submit(short, float("inf"))  # a request after the close: dropped at once
    with pytest.raises(serve.Dropped, match="closed"):
        after.future.result(0)


def test_short_requests_racing_a_closing_server_are_each_answered_or_dropped(direct):
    service = direct()
    reqs = [serve.parse_request(_body(REPORT, f"Who approved it, case {i}?"), service.cfg) for i in range(8)]
    jobs, lock, stop = [], threading.Lock(), threading.Event()

    def client(k):
        while not stop.is_set():
            job = service.submit(reqs[k], float("inf"))
            with lock:
                jobs.append((reqs[k].question, job))
            time.sleep(0.001)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while service.served < 5:  # some answered, more in flight
        time.sleep(0.005)
    closed_at = len(jobs)
    service.close()
    health = service.health()  # (reads the routers and queues while clients still submit)
    stop.set()
    for t in threads:
        t.join(30)
    assert not service.scheduler._thread.is_alive()
    results = {"answered": 0, "closed": 0}
    for question, job in jobs:
        try:
            assert job.future.result(0)["question"] == question
            results["answered"] += 1
        except serve.Dropped as e:
            assert e.why == "closed"
            results["closed"] += 1
    assert results["answered"] >= 5 and results["closed"] >= 1 and len(jobs) > closed_at
    assert results["answered"] == service.served and health["queue"]["short"]["bytes"] == 0


def test_health_shows_what_is_in_flight_by_size(direct):
    service = direct(slice_bytes=4096)
    release = _held(service)
    short = service.submit(
        serve.parse_request(json.dumps({"context": REPORT, "question": QUESTION}).encode(), service.cfg), float("inf")
    )
    long = service.submit(
        serve.parse_request(json.dumps({"context": LONG, "question": QUESTION}).encode(), service.cfg), float("inf")
    )
    lanes = service.scheduler.lanes()
    assert lanes["short"] == {"in_flight": 1, "bytes": len(REPORT.encode())}
    assert lanes["long"]["in_flight"] == 1 and lanes["long"]["bytes"] == len(LONG.encode())
    release.set()
    short.future.result(60), long.future.result(60)
    h = service.health()["queue"]
    assert h["short"]["in_flight"] == h["long"]["in_flight"] == 0 and h["long"]["slices"] == []


def test_a_failing_batch_answers_its_requests_and_the_worker_goes_on(direct):
    service = direct()
    real, calls = service.scheduler.run_batch, []

    def broken(jobs):
        calls.append(len(jobs))
        if len(calls) == 1:
            raise RuntimeError("a bug in the batch")
        real(jobs)

    service.scheduler.run_batch = broken
    req = serve.parse_request(json.dumps({"context": REPORT, "question": QUESTION}).encode(), service.cfg)
    with pytest.raises(RuntimeError, match="a bug in the batch"):
        service.submit(req, float("inf")).future.result(60)
    assert ANSWERING in service.submit(req, float("inf")).future.result(60)["pruned_text"]
