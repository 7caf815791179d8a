"""``masklab serve`` under load, against one ``masklab compress`` process per question.

    python benchmarks/serve_load.py [--router dense] [--requests 600] [--clients 8] [--max-seconds 600]
                                    [--repeated 100] [--json benchmarks/serve_load.json]

Starts ``python -m masklab serve`` (SmolLM2's tokenizer, ``--router``: by default masklab's
default router, answers off) on a free port of 127.0.0.1.

First, repeated questions on an already-embedded document: one ~3k-token document sent once
(for the dense routers: embedded then, its time recorded), then ``--repeated`` requests with
the same document and a different question each, from one client in turn and then
``--repeated`` x ``--clients`` from ``--clients`` concurrent clients: p50 / p99 latency and
requests per second of each (goal: at least 10 requests per second).

Then the mixed load: ``--requests`` requests from ``--clients`` concurrent
clients (one httpx connection each), in rounds; no request is sent after ``--max-seconds``
(counted from the server's start), and the requests not sent are counted.
The requests mix sizes, from a short note to a multi-thousand-token document and lists of
passages, cut from ``masklab/data/realdocs/docs/*.txt`` when present, else from
``/usr/share/common-licenses/*``, each with a question made of words of its document; about
5% are malformed (not JSON, an empty question, a keep of 2, an unknown router, wrong types,
an unknown field, a body over ``--max-request-bytes``). Recorded: every status (0 server
errors, every malformed request a 4xx is the goal), p50/p99 latency and the throughput of
the good ones, the server's resident memory after start and at the end, and per question
one request to the idle service against one ``python -m masklab compress --json`` process
for the same document and question (interleaved between the rounds; goal: the service at
least 10x faster per question).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's masklab (its default router), as the server it starts
from masklab.context.router import DEFAULT_ROUTER  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
MAX_REQUEST_BYTES = 1_000_000
WORD = re.compile(r"[A-Za-z]{5,}")


def corpus() -> tuple[str, list[str]]:
    docs = sorted((ROOT / "masklab/data/realdocs/docs").glob("*.txt"))
    where = "masklab/data/realdocs/docs/*.txt"
    if not docs:
        docs = sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file() and not p.is_symlink())
        where = "/usr/share/common-licenses/*"
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in docs]
    return where, [t for t in texts if t.strip()]


def question(rng: random.Random, text: str) -> str:
    words = WORD.findall(text) or ["anything"]
    return f"What does it say about {' and '.join(rng.sample(words, min(2, len(words))))}?"


def good_request(rng: random.Random, texts: list[str]) -> tuple[str, dict]:
    """``(size class, body)``: a note (a paragraph), a section (~2-4k characters), a whole
    document (up to 35 KB, several thousand tokens) or 3-6 passages of one."""
    doc = rng.choice(texts)
    kind = rng.choices(["note", "section", "document", "passages"], [4, 3, 2, 2])[0]
    paras = [p for p in doc.split("\n\n") if p.strip()] or [doc]
    if kind == "note":
        ctx = rng.choice(paras)
    elif kind == "section":
        a = rng.randrange(max(1, len(doc) - 3000))
        ctx = doc[a : a + rng.randint(2000, 4000)]
    elif kind == "document":
        ctx = doc
    else:
        ctx = rng.sample(paras, min(len(paras), rng.randint(3, 6)))
    text = ctx if isinstance(ctx, str) else " ".join(ctx)
    if not text.strip():
        ctx = text = doc
    body = {"context": ctx, "question": question(rng, text)}
    if rng.random() < 0.5:
        body["keep"] = rng.choice([0.1, 0.25, 0.5])
    else:
        body["target_tokens"] = rng.choice([64, 200, 500])
    return kind, body


def malformed(i: int) -> tuple[str, bytes]:
    kinds = [
        ("not json", b"{context: nope"),
        ("empty question", json.dumps({"context": "Some text here.", "question": " "}).encode()),
        ("keep 2", json.dumps({"context": "Some text here.", "question": "What?", "keep": 2}).encode()),
        ("unknown router", json.dumps({"context": "Some text here.", "question": "What?", "router": "nope"}).encode()),
        ("wrong type", json.dumps({"context": 42, "question": "What?"}).encode()),
        ("unknown field", json.dumps({"context": "Some text.", "question": "What?", "budget": 1}).encode()),
        ("oversized", json.dumps({"context": "x " * (MAX_REQUEST_BYTES // 2 + 10), "question": "What?"}).encode()),
    ]
    return kinds[i % len(kinds)]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def repeated_phase(url: str, doc: str, questions: list[str], clients: int) -> dict:
    """``questions`` on document ``doc`` (sent once before, so already embedded) from
    ``clients`` concurrent clients: statuses, p50 / p99 and requests per second."""
    pool_clients = [httpx.Client(timeout=300) for _ in range(clients)]

    def send(item):
        j, q = item
        t0 = time.perf_counter()
        try:
            r = pool_clients[j % clients].post(f"{url}/v1/compress", json={"context": doc, "question": q, "keep": 0.1})
            status = r.status_code
        except httpx.HTTPError as e:
            status = f"client error: {type(e).__name__}"
        return status, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(send, enumerate(questions)))
    wall = time.perf_counter() - t0
    for c in pool_clients:
        c.close()
    lat = [s for st, s in got if st == 200]
    statuses: dict[str, int] = {}
    for st, _ in got:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    return {
        "clients": clients,
        "requests": len(got),
        "statuses": statuses,
        "server_errors": sum(1 for st, _ in got if isinstance(st, int) and st >= 500),
        "p50_seconds": statistics.median(lat) if lat else None,
        "p99_seconds": pct(lat, 0.99) if lat else None,
        "requests_per_second": len(got) / wall,
        "seconds": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--router", default=DEFAULT_ROUTER, help=f"the server's router (default: {DEFAULT_ROUTER}, masklab's default)"
    )
    ap.add_argument(
        "--repeated", type=int, default=100, help="questions on the already-embedded document, per client count"
    )
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="load rounds; one service and one CLI question after each")
    ap.add_argument("--malformed", type=float, default=0.05, help="share of malformed requests")
    ap.add_argument("--max-seconds", type=float, default=600, help="send no mixed-load request after this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    where, texts = corpus()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "masklab",
        "serve",
        "--model",
        a.model,
        "--router",
        a.router,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--request-seconds",
        "300",
    ]
    t_start = time.perf_counter()
    server = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited: {server.stdout.read()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        startup = time.perf_counter() - t_start
        rss_start = rss_mb(server.pid)
        load_before = os.getloadavg()

        plan = []  # (kind, body bytes, malformed?)
        for i in range(a.requests):
            if rng.random() < a.malformed:
                kind, body = malformed(len([p for p in plan if p[2]]))
                plan.append((kind, body, True))
            else:
                kind, body = good_request(rng, texts)
                plan.append((kind, json.dumps(body).encode(), False))
        probe_doc = max(texts, key=len)[:12000]  # the per-question comparison: one ~3k-token document
        probes = [question(rng, probe_doc) for _ in range(a.rounds)]

        # repeated questions on one already-embedded document: one client, then --clients
        t0 = time.perf_counter()
        first = httpx.post(
            f"{url}/v1/compress", json={"context": probe_doc, "question": probes[0], "keep": 0.1}, timeout=300
        )
        first_seconds = time.perf_counter() - t0
        assert first.status_code == 200, first.text
        repeated = {
            "doc_chars": len(probe_doc),
            "doc_tokens": first.json()["context_tokens"],
            "first_request_seconds": first_seconds,
            "keep": 0.1,
            "goal_requests_per_second_at_least": 10,
        }
        for n in (1, a.clients):
            qs = []
            while len(qs) < a.repeated * n:  # a different question each time
                q = question(rng, probe_doc)
                if q not in qs and q not in probes:
                    qs.append(q)
            repeated[f"clients_{n}"] = repeated_phase(url, probe_doc, qs, n)

        clients = [httpx.Client(timeout=300) for _ in range(a.clients)]
        results = []  # (kind, malformed, status, seconds)

        def send(item):
            j, (kind, body, bad) = item
            if time.perf_counter() - t_start > a.max_seconds:
                return kind, bad, "not sent", 0.0
            t0 = time.perf_counter()
            try:
                status = (
                    clients[j % a.clients]
                    .post(f"{url}/v1/compress", content=body, headers={"content-type": "application/json"})
                    .status_code
                )
            except httpx.HTTPError as e:
                status = f"client error: {type(e).__name__}"
            return kind, bad, status, time.perf_counter() - t0

        service_q, cli_q = [], []
        with tempfile.TemporaryDirectory() as tmp:
            doc_file = Path(tmp) / "doc.txt"
            doc_file.write_text(probe_doc)
            per_round = -(-len(plan) // a.rounds)
            t_load = 0.0
            sent = unsent = 0
            for r in range(a.rounds):
                chunk = plan[r * per_round : (r + 1) * per_round]
                if time.perf_counter() - t_start > a.max_seconds:
                    unsent += len(chunk)
                    continue
                t0 = time.perf_counter()
                with ThreadPoolExecutor(a.clients) as pool:
                    results += list(pool.map(send, enumerate(chunk, start=sent)))
                t_load += time.perf_counter() - t0
                sent += len(chunk)
                if time.perf_counter() - t_start > a.max_seconds:
                    continue  # out of time: no per-question comparison either
                # one question through the idle service, then the same question as one CLI process
                t0 = time.perf_counter()
                resp = httpx.post(f"{url}/v1/compress", json={"context": probe_doc, "question": probes[r]}, timeout=300)
                service_q.append(time.perf_counter() - t0)
                assert resp.status_code == 200, resp.text
                t0 = time.perf_counter()
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "masklab",
                        "compress",
                        "--context",
                        str(doc_file),
                        "--question",
                        probes[r],
                        "--router",
                        a.router,
                        "--device",
                        "cpu",
                        "--json",
                    ],
                    cwd=ROOT,
                    env=ENV,
                    capture_output=True,
                    text=True,
                )
                cli_q.append(time.perf_counter() - t0)
                assert out.returncode == 0, out.stderr
                assert json.loads(out.stdout)["kept"] == resp.json()["kept"], (
                    "the service and the CLI kept different units"
                )
        for c in clients:
            c.close()
        rss_end = rss_mb(server.pid)
        load_after = os.getloadavg()
    finally:
        server.terminate()
        server.wait(30)

    unsent += sum(1 for x in results if x[2] == "not sent")
    results = [x for x in results if x[2] != "not sent"]
    good = [x for x in results if not x[1]]
    bad = [x for x in results if x[1]]
    ok_lat = [s for _, _, st, s in good if st == 200]
    statuses: dict[str, int] = {}
    for _, _, st, _ in results:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    by_kind = {
        k: sorted(s for kk, b, st, s in good if kk == k and st == 200)
        for k in ("note", "section", "document", "passages")
    }
    svc = statistics.median(service_q) if service_q else None
    cli = statistics.median(cli_q) if cli_q else None
    out = {
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores shared with other work (the 2-core development machine, other jobs "
        "running on it at the same time: see the load averages); one torch thread in the server; the "
        "clients run on the same cores",
        "router": a.router,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "server": " ".join(cmd[1:]).replace(str(port), "PORT"),
        "corpus": where,
        "repeated_questions": repeated,
        "requests": len(results),
        "requests_not_sent": unsent,
        "clients": a.clients,
        "good_requests": len(good),
        "malformed_requests": len(bad),
        "statuses": statuses,
        "server_errors": sum(1 for *_, st, _ in results if isinstance(st, int) and st >= 500),
        "client_errors": sum(1 for *_, st, _ in results if isinstance(st, str)),
        "good_not_200": sum(1 for *_, st, _ in good if st != 200),
        "malformed_not_4xx": sum(1 for *_, st, _ in bad if not (isinstance(st, int) and 400 <= st < 500)),
        "malformed_kinds": sorted({k for k, *_ in bad}),
        "p50_seconds": statistics.median(ok_lat),
        "p99_seconds": pct(ok_lat, 0.99),
        "p50_seconds_by_size": {k: statistics.median(v) for k, v in by_kind.items() if v},
        "throughput_per_second": len(good) / t_load,
        "load_seconds": t_load,
        "server_startup_seconds": startup,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "question_doc_chars": len(probe_doc),
        "service_question_seconds": service_q,
        "cli_question_seconds": cli_q,
        "service_question_median_seconds": svc,
        "cli_question_median_seconds": cli,
        "cli_over_service": cli / svc if svc and cli else None,
        "goal_cli_over_service_at_least": 10,
    }
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list) or len(v) < 10}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
