"""``masklab serve``'s scheduler against one request at a time in arrival order: batching and slices.

    python benchmarks/serve_sched.py [--rounds 2] [--seconds 40] [--json benchmarks/serve_sched.json]

Starts two servers side by side (SmolLM2's tokenizer, masklab's default router, one torch
thread each, 127.0.0.1) and loads them in turn, interleaved round by round, so the shared
machine's load falls on both alike:

* ``scheduled``: the defaults (short requests batched, long documents in slices);
* ``one_at_a_time``: ``--max-batch 1 --slice-bytes 1000000000``, what the service did before
  (every request whole, in arrival order).

Batching: 8 concurrent clients ask different questions about one ~2,000-token document
(already embedded by a first request); requests per second of each server, their ratio, and
whether the two servers' answers agree (every field but the timings, ``seconds`` and
``router_seconds`` among them; the scores to float32 rounding).

Fairness: for ``--seconds`` per server and round, 4 clients send short requests (the soak's
repeated documents with new questions, and distinct notes) while one client sends distinct
long documents (90-99% of 64 KiB; every other one as 4 passages) back to back: p50 / p99 of
the short requests (all, and those that finished while a long document was in flight), of
the long ones, and the p99/p50 of all. The JSON records the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from serve_soak import ENV, Mix, corpus, free_port, pct, timing  # noqa: E402

from masklab.context.router import DEFAULT_ROUTER  # noqa: E402
from masklab.lab import revision  # noqa: E402

SERVERS = {"scheduled": [], "one_at_a_time": ["--max-batch", "1", "--slice-bytes", "1000000000"]}
MAX_CONTEXT = 65_536


def start(name: str, extra: list[str], log_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "masklab",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--max-context-bytes",
        str(MAX_CONTEXT),
        "--request-seconds",
        "300",
        "--max-queue",
        "64",
        *extra,
    ]
    log = open(log_dir / f"serve_sched.{name}.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(proc, url: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"serve_sched: a server exited ({proc.returncode}); see serve_sched.*.log in {tempfile.gettempdir()}"
            )
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("serve_sched: a server did not start within 300 s")


def document(texts: list[str], tokens: int = 2000) -> str:
    """About ``tokens`` tokens (~4.3 characters each) of paragraphs of the corpus."""
    paras = [p.strip() for t in texts for p in t.split("\n\n") if len(p.strip()) > 40]
    out, size = [], 0
    for p in paras:
        out.append(p)
        size += len(p)
        if size > tokens * 4.3:
            break
    return "\n\n".join(out)


def strip(out: dict) -> dict:
    """``out`` without the scores (compared to float rounding apart) and every timing field
    (``seconds``, ``router_seconds``, ``answer_seconds``, ...: any key ending in ``seconds``)."""
    return {k: v for k, v in out.items() if k != "scores" and not k.endswith("seconds")}


def batching_round(url: str, doc: str, questions: list[str], clients: int) -> tuple[float, list[dict]]:
    """Requests per second of ``clients`` clients sending ``questions`` (one each, in turn)."""
    http = [httpx.Client(timeout=300) for _ in range(clients)]

    def send(k):
        r = http[k % clients].post(f"{url}/v1/compress", json={"context": doc, "question": questions[k], "keep": 0.1})
        r.raise_for_status()
        return r.json()

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(send, range(len(questions))))
    seconds = time.monotonic() - t0
    for c in http:
        c.close()
    return len(questions) / seconds, got


def same(a: dict, b: dict) -> bool:
    if strip(a) != strip(b):
        return False
    return all(abs(x - y) <= 1e-6 for x, y in zip(a["scores"], b["scores"]))


def passages(text: str, n: int) -> list[str]:
    """``text`` as ``n`` passages of about equal size, cut at paragraph breaks."""
    paras = text.split("\n\n")
    step = max(1, -(-len(paras) // n))
    return ["\n\n".join(paras[k : k + step]) for k in range(0, len(paras), step)]


def fairness_round(url: str, mix: Mix, seconds: float, seed: int) -> list[tuple]:
    """``(kind, seconds, queue, work, long_in_flight)`` of every request of one phase."""
    stop, lock, rows = threading.Event(), threading.Lock(), []
    long_busy = [0]

    def shorts(j):
        rng = random.Random(seed * 100 + j)
        http = httpx.Client(timeout=300)
        serial = 0
        while not stop.is_set():
            serial += 1
            kind = "repeated" if rng.random() < 0.8 else "distinct"
            ctx = (
                rng.choice(mix.fixed)
                if kind == "repeated"
                else mix.distinct(rng, seed * 10**6 + j * 10**4 + serial, rng.choice([1, 2, 3]))
            )
            body = {"context": ctx, "question": mix.question(rng, ctx), "keep": 0.25}
            busy_before = long_busy[0]
            s0 = time.monotonic()
            r = http.post(f"{url}/v1/compress", json=body)
            took = time.monotonic() - s0
            q, w = timing(r.headers.get("server-timing"))
            with lock:
                rows.append(
                    (
                        "short" if r.status_code == 200 else f"short {r.status_code}",
                        took,
                        q,
                        w,
                        bool(busy_before or long_busy[0]),
                    )
                )
        http.close()

    def longs():
        rng = random.Random(seed)
        http = httpx.Client(timeout=300)
        serial = 0
        while not stop.is_set():
            serial += 1
            text = mix.long(rng, seed * 10**6 + 9 * 10**5 + serial)
            ctx = passages(text, 4) if serial % 2 == 0 else text  # every other one as several passages
            long_busy[0] += 1
            s0 = time.monotonic()
            r = http.post(f"{url}/v1/compress", json={"context": ctx, "question": mix.question(rng, text)})
            took = time.monotonic() - s0
            long_busy[0] -= 1
            q, w = timing(r.headers.get("server-timing"))
            with lock:
                rows.append(("long" if r.status_code == 200 else f"long {r.status_code}", took, q, w, True))
        http.close()

    threads = [threading.Thread(target=shorts, args=(j,)) for j in range(4)] + [threading.Thread(target=longs)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(600)
    return rows


def summary(rows: list[tuple]) -> dict:
    short = [r[1] for r in rows if r[0] == "short"]
    during = [r[1] for r in rows if r[0] == "short" and r[4]]
    long = [r[1] for r in rows if r[0] == "long"]
    good = short + long
    p50, p99 = statistics.median(good), pct(good, 0.99)
    return {
        "short_requests": len(short),
        "short_p50_seconds": statistics.median(short),
        "short_p99_seconds": pct(short, 0.99),
        "short_during_long_requests": len(during),
        "short_during_long_p99_seconds": pct(during, 0.99),
        "long_requests": len(long),
        "long_p50_seconds": statistics.median(long) if long else None,
        "p50_seconds": p50,
        "p99_seconds": p99,
        "p99_over_p50": p99 / p50,
        "failed": sum(1 for r in rows if r[0] not in ("short", "long")),
        "short_work_p50_seconds": pct([r[3] for r in rows if r[0] == "short" and r[3] is not None], 0.5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per part (default 2)")
    ap.add_argument("--seconds", type=float, default=40, help="seconds of each fairness phase (default 40)")
    ap.add_argument("--requests", type=int, default=96, help="requests of each batching phase (default 96)")
    ap.add_argument("--clients", type=int, default=8, help="batching clients (default 8)")
    ap.add_argument("--json", default=str(HERE / "serve_sched.json"), help="where to write the figures")
    a = ap.parse_args()
    where, texts = corpus()
    mix = Mix(texts, MAX_CONTEXT, 40, 0)
    out = {
        "command": "python benchmarks/serve_sched.py " + " ".join(sys.argv[1:]),
        "router": DEFAULT_ROUTER,
        "servers": {k: " ".join(v) or "(defaults)" for k, v in SERVERS.items()},
        "corpus": where,
        "code": revision.code_hash("masklab.context.serve"),
        "code_ast": revision.code_ast("masklab.context.serve"),
        "git_rev": revision.git_rev(),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs (load average below); both servers one "
        "torch thread; the clients run on the same cores",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    procs = {name: start(name, extra, Path(tempfile.gettempdir())) for name, extra in SERVERS.items()}
    try:
        for name, (proc, url) in procs.items():
            wait_up(proc, url)
        doc = document(texts)
        rng = random.Random(1)
        first = {}
        for name, (_, url) in procs.items():  # embed the document once on each
            first[name] = httpx.post(
                f"{url}/v1/compress", json={"context": doc, "question": "What is it about?"}, timeout=300
            ).json()
        out["batching"] = {
            "doc_tokens": first["scheduled"]["context_tokens"],
            "clients": a.clients,
            "requests_per_round": a.requests,
            "rounds": [],
        }
        rps = {name: [] for name in procs}
        agree = True
        for k in range(a.rounds):
            questions = [mix.question(rng, doc) + f" ({k}.{i})" for i in range(a.requests)]
            answers = {}
            for name, (_, url) in procs.items() if k % 2 == 0 else reversed(procs.items()):
                r, answers[name] = batching_round(url, doc, questions, a.clients)
                rps[name].append(r)
            agree &= all(same(x, y) for x, y in zip(answers["scheduled"], answers["one_at_a_time"]))
            out["batching"]["rounds"].append({name: rps[name][-1] for name in procs})
            print(f"batching round {k}: " + ", ".join(f"{n} {v[-1]:.1f} req/s" for n, v in rps.items()), flush=True)
        total = {name: statistics.mean(v) for name, v in rps.items()}
        out["batching"].update({f"{n}_requests_per_second": v for n, v in total.items()})
        out["batching"]["ratio"] = total["scheduled"] / total["one_at_a_time"]
        out["batching"]["same_answers"] = agree
        out["batching"]["batches"] = httpx.get(f"{procs['scheduled'][1]}/healthz").json()["batches"]
        rows = {name: [] for name in procs}
        for k in range(a.rounds):
            for name, (_, url) in procs.items() if k % 2 == 0 else reversed(procs.items()):
                rows[name] += fairness_round(url, mix, a.seconds, seed=10 + k)
                s = summary(rows[name])
                print(
                    f"fairness round {k} {name}: short p99 {s['short_p99_seconds']:.2f} s, during long "
                    f"{s['short_during_long_p99_seconds']}, p99/p50 {s['p99_over_p50']:.1f}",
                    flush=True,
                )
        out["fairness"] = {
            "seconds_per_phase": a.seconds,
            "rounds": a.rounds,
            **{name: summary(r) for name, r in rows.items()},
        }
        f = out["fairness"]
        out["fairness"]["short_p99_ratio"] = (
            f["one_at_a_time"]["short_p99_seconds"] / f["scheduled"]["short_p99_seconds"]
        )
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("batching", "fairness")}, indent=1))


if __name__ == "__main__":
    main()
