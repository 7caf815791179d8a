"""``masklab serve`` over a long run: resident memory, caches and latency per minute.

    python benchmarks/serve_soak.py [--minutes 30] [--requests 10000] [--clients 4]
                                    [--out docs/results/serve_soak] [--quick]

Starts ``python -m masklab serve`` (SmolLM2's tokenizer, masklab's default router, one torch
thread, answers off) on a free port of 127.0.0.1 and sends it requests from ``--clients``
concurrent clients (one httpx connection each, 127.0.0.1 only) until both ``--requests``
requests have been sent and ``--minutes`` have passed, and never past ``--max-minutes`` or
``--max-requests`` (the hard bounds of the loop). The requests mix, from
``masklab/data/realdocs/docs/*.txt`` (else ``/usr/share/common-licenses/*``):

* repeated: one of ``--repeated-docs`` fixed documents with a new question each (the
  embedder's cache hits);
* distinct: a note or a section made of paragraphs drawn at random, with a serial number
  in it, so every one is a new document (the cache misses, and fills);
* passages: 3-4 distinct paragraphs as a list (one budget across them);
* long: a distinct document of 90-99% of the server's ``--max-context-bytes``;
* routers: a repeated document through each product router other than the server's in turn
  (the server keeps every one loaded: ``--max-routers`` as many; each is loaded before the run);
* abandoned: a repeated request whose client gives up after 20 ms (a disconnect);
* bad: not JSON, a wrong type, a 20 MB body, an unknown router, an empty question, a
  context over the limit (each must be a 4xx).

Each ``--interval`` seconds (a minute by default) one row is added: the requests finished in
it, their statuses, p50 / p99 latency of the good ones (and of their queue wait and work,
from the server's ``Server-Timing``), the server's resident memory (``/proc``), its caches'
sizes and limits (``GET /healthz``) and the load average of the machine (it is shared). The
JSON file is rewritten (atomically) after every row, so a killed run keeps every finished
minute; the PNG plot is drawn every few rows and at the end.
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
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from masklab.lab import revision  # noqa: E402
from masklab.context.router import DEFAULT_ROUTER  # noqa: E402
from masklab.context.routers import ROUTERS  # noqa: E402  (every product router)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
WORD = re.compile(r"[A-Za-z]{5,}")
KINDS = {"repeated": 75, "distinct": 14, "passages": 4, "long": 0.12, "routers": 0.5, "abandoned": 0.5, "bad": 5}
# (shares, %); "routers": a repeated document asked through each other product router in turn
RSS_BOUND_MB = 1536  # the server's resident memory with every product router loaded stays under it (docs/serve.md)
BAD = ("not json", "wrong type", "20 MB body", "unknown router", "empty question", "context over the limit")
HUGE = 20 * 2**20


def corpus() -> tuple[str, list[str]]:
    docs = sorted((ROOT / "masklab/data/realdocs/docs").glob("*.txt"))
    where = "masklab/data/realdocs/docs/*.txt"
    if not docs:
        docs = sorted(p for p in Path("/usr/share/common-licenses").iterdir() if p.is_file() and not p.is_symlink())
        where = "/usr/share/common-licenses/*"
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in docs]
    return where, [t for t in texts if t.strip()]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mix:
    """The requests: ``make(rng, serial) -> (kind, bad kind or None, body bytes)``."""

    def __init__(
        self, texts: list[str], max_context: int, repeated_docs: int, seed: int, routers: tuple[str, ...] = ()
    ) -> None:
        rng = random.Random(seed)
        self.routers = routers  # the routers the "routers" requests name in turn
        self.paras = [p.strip() for t in texts for p in t.split("\n\n") if len(p.strip()) > 40]
        self.max_context = max_context
        self.fixed = []
        for _ in range(repeated_docs):
            n = rng.randint(3, 15)
            self.fixed.append("\n\n".join(rng.sample(self.paras, min(n, len(self.paras)))))
        self.huge = json.dumps({"context": "x " * (HUGE // 2), "question": "What?"}).encode()

    def question(self, rng: random.Random, text: str) -> str:
        words = WORD.findall(text) or ["anything"]
        return f"What does it say about {' and '.join(rng.sample(words, min(2, len(words))))}?"

    def distinct(self, rng: random.Random, serial: int, paras: int) -> str:
        chosen = rng.sample(self.paras, min(paras, len(self.paras)))
        chosen.insert(rng.randrange(len(chosen) + 1), f"Record {serial}-{rng.getrandbits(32):08x} was filed.")
        return "\n\n".join(chosen)

    def long(self, rng: random.Random, serial: int) -> str:
        goal = rng.uniform(0.90, 0.99) * self.max_context
        parts, size = [f"Record {serial}-{rng.getrandbits(32):08x} was filed."], 0
        while size < goal:
            p = rng.choice(self.paras)
            parts.append(p)
            size += len(p.encode()) + 2
        text = "\n\n".join(parts)
        return text.encode()[: int(goal)].decode("utf-8", errors="ignore")

    def make(self, rng: random.Random, serial: int) -> tuple[str, str | None, bytes]:
        kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
        budget = (
            {"keep": rng.choice([0.1, 0.25, 0.5])}
            if rng.random() < 0.5
            else {"target_tokens": rng.choice([64, 200, 500])}
        )
        if kind == "bad":
            what = BAD[serial % len(BAD)]
            if what == "not json":
                return kind, what, b'{"context": "Some text.", "question": '
            if what == "20 MB body":
                return kind, what, self.huge
            body = {"context": "Some text here.", "question": "What is here?"}
            if what == "wrong type":
                body["context"] = 42
            elif what == "unknown router":
                body["router"] = "no-such-router"
            elif what == "empty question":
                body["question"] = "   "
            else:
                body["context"] = "y" * (self.max_context + 1)
            return kind, what, json.dumps(body).encode()
        if kind == "routers" and self.routers:
            ctx = rng.choice(self.fixed)
            body = {
                "context": ctx,
                "question": self.question(rng, ctx),
                "router": self.routers[serial % len(self.routers)],
            }
            return kind, None, json.dumps({**body, **budget}).encode()
        if kind in ("repeated", "abandoned", "routers"):
            ctx = rng.choice(self.fixed)
        elif kind == "distinct":
            ctx = self.distinct(rng, serial, rng.choice([1, 1, 2, 3, 6]))
        elif kind == "passages":
            ctx = [self.distinct(rng, serial, 1) for _ in range(rng.randint(3, 4))]
        else:
            ctx = self.long(rng, serial)
        text = ctx if isinstance(ctx, str) else " ".join(ctx)
        return kind, None, json.dumps({"context": ctx, "question": self.question(rng, text), **budget}).encode()


def timing(header: str | None) -> tuple[float | None, float | None]:
    """``(queue, work)`` seconds of a ``Server-Timing: queue;dur=..., work;dur=...`` header."""
    got = dict(re.findall(r"(\w+);dur=([\d.]+)", header or ""))
    q, w = got.get("queue"), got.get("work")
    return (float(q) / 1000 if q else None), (float(w) / 1000 if w else None)


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["minutes"]
    if not rows:
        return
    m = [r["minute"] for r in rows]
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    a.plot(m, [r["rss_mb"] for r in rows], marker=".", label="server RSS (MiB)")
    a.set_ylabel("MiB")
    ax2 = a.twinx()
    ax2.plot(m, [r["requests_total"] for r in rows], color="grey", ls=":", label="requests so far")
    ax2.set_ylabel("requests so far")
    a.legend(loc="upper left")
    a.set_title(
        f"masklab serve soak: {out['summary'].get('requests', 0):,} requests, {out['summary'].get('minutes', 0):.0f} "
        f"min, {out['clients']} clients, router {out['router']}"
    )
    b.plot(m, [r["p50_seconds"] for r in rows], marker=".", label="p50")
    b.plot(m, [r["p99_seconds"] for r in rows], marker=".", label="p99")
    b.plot(m, [r["work_p99_seconds"] for r in rows], ls="--", label="p99 of the work alone")
    b.set_ylabel("latency of good requests (s)")
    b.set_yscale("log")
    b.legend(loc="upper left")
    c.bar(m, [r["good"] for r in rows], label="good (200)")
    c.bar(m, [r["bad"] for r in rows], bottom=[r["good"] for r in rows], label="bad (4xx)")
    c.plot(m, [r["good_failed"] * 10 for r in rows], color="red", marker="x", ls="", label="good not 200 (x10)")
    c.set_ylabel("requests per minute")
    ax3 = c.twinx()
    ax3.plot(m, [r["load_average_1m"] for r in rows], color="black", lw=0.8, label="load average (1 min)")
    ax3.set_ylabel("load average")
    c.legend(loc="upper left")
    c.set_xlabel("minute")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


def write_json(out: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30, help="run at least this long (default 30)")
    ap.add_argument("--requests", type=int, default=10_000, help="send at least this many requests (default 10000)")
    ap.add_argument("--max-minutes", type=float, default=None, help="hard bound on the run (default 1.5 x --minutes)")
    ap.add_argument("--max-requests", type=int, default=None, help="hard bound on requests (default 3 x --requests)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    ap.add_argument("--interval", type=float, default=60, help="seconds per row of the table (default 60)")
    ap.add_argument("--model", default="smollm2-135m", help="the server's model (default smollm2-135m)")
    ap.add_argument("--router", default=DEFAULT_ROUTER, help=f"the server's router (default {DEFAULT_ROUTER})")
    ap.add_argument(
        "--max-context-bytes",
        type=int,
        default=65_536,
        help="the server's --max-context-bytes; the long documents are 90-99%% of it "
        "(default 65536: one takes the 2 shared cores ~10 s)",
    )
    ap.add_argument("--repeated-docs", type=int, default=40, help="fixed documents the repeated requests draw from")
    ap.add_argument("--server-args", default="", help='more flags for masklab serve, e.g. "--no-trim"')
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        default="docs/results/serve_soak",
        help="write OUT.json (every row) and OUT.png (default docs/results/serve_soak)",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke test: 2 minutes, 300 requests, 20 s rows")
    a = ap.parse_args()
    if a.quick:
        a.minutes, a.requests, a.interval = min(a.minutes, 2), min(a.requests, 300), min(a.interval, 20)
    if a.minutes <= 0 or a.requests < 1 or a.clients < 1 or a.interval <= 0:
        raise SystemExit("serve_soak: --minutes, --requests, --clients and --interval must be positive")
    max_minutes = a.max_minutes or 1.5 * a.minutes
    max_requests = a.max_requests or 3 * a.requests
    out_path = Path(a.out)
    if not out_path.is_absolute():
        out_path = ROOT / out_path
    out_path.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_path.with_suffix(".json"), out_path.with_suffix(".png")

    where, texts = corpus()
    others = tuple(n for n in ROUTERS if n != a.router)
    mix = Mix(texts, a.max_context_bytes, a.repeated_docs, a.seed, others)
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
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--max-request-bytes",
        "1000000",
        "--max-context-bytes",
        str(a.max_context_bytes),
        "--request-seconds",
        "120",
        "--max-routers",
        str(len(ROUTERS)),
        *a.server_args.split(),
    ]
    log = open(out_path.with_suffix(".server.log"), "w")
    t_start = time.monotonic()
    server = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, text=True)
    out = {
        "command": "python benchmarks/serve_soak.py " + " ".join(sys.argv[1:]),
        "server": " ".join(cmd[1:]).replace(str(port), "PORT"),
        "router": a.router,
        "model": a.model,
        "clients": a.clients,
        "corpus": where,
        "mix_weights": KINDS,
        "bad_kinds": list(BAD),
        "machine": f"{os.cpu_count()} CPU cores shared with other engineers' jobs (see load_average_1m per minute); "
        "one torch thread in the server; the clients run on the same cores",
        "code": revision.code_hash("masklab.context.serve"),
        "code_ast": revision.code_ast("masklab.context.serve"),
        "git_rev": revision.git_rev(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "finished": False,
        "minutes": [],
        "rss_samples": [],
        "summary": {},
    }
    results: list[tuple] = []  # (t_done, kind, bad, status, seconds, queue, work)
    lock = threading.Lock()
    stop = threading.Event()
    counter = [0]
    try:
        deadline = t_start + 300
        while True:  # wait for the model to load (bounded)
            if server.poll() is not None:
                raise SystemExit(f"serve_soak: the server exited ({server.returncode}); see {log.name}")
            if time.monotonic() > deadline:
                raise SystemExit("serve_soak: the server did not start within 300 s")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        out["server_startup_seconds"] = time.monotonic() - t_start
        w0 = time.monotonic()
        for name in others:  # every product router loaded before the run (what the RSS bound counts)
            body = {"context": mix.fixed[0], "question": "What is it about?", "router": name}
            r = httpx.post(f"{url}/v1/compress", json=body, timeout=300)
            if r.status_code != 200:
                raise SystemExit(f"serve_soak: router {name} answered {r.status_code}: {r.text[:200]}")
        out["routers_loaded_seconds"] = time.monotonic() - w0
        out["rss_mb_start"] = rss_mb(server.pid)
        t0 = time.monotonic()

        def done_enough() -> bool:
            elapsed = (time.monotonic() - t0) / 60
            with lock:
                n = counter[0]
            return (n >= a.requests and elapsed >= a.minutes) or elapsed >= max_minutes or n >= max_requests

        def client(j: int) -> None:
            rng = random.Random(a.seed * 1000 + j + 1)
            http = httpx.Client(timeout=300)
            try:
                while not stop.is_set() and not done_enough():
                    with lock:
                        serial = counter[0]
                        counter[0] += 1
                    kind, bad, body = mix.make(rng, serial)
                    s0 = time.monotonic()
                    q = w = None
                    try:
                        if kind == "abandoned":
                            with httpx.Client(timeout=0.02) as quick:
                                r = quick.post(
                                    f"{url}/v1/compress", content=body, headers={"content-type": "application/json"}
                                )
                        else:
                            r = http.post(
                                f"{url}/v1/compress", content=body, headers={"content-type": "application/json"}
                            )
                        status = r.status_code
                        q, w = timing(r.headers.get("server-timing"))
                    except httpx.TimeoutException:
                        status = "timeout"
                    except httpx.HTTPError as e:
                        status = f"client error: {type(e).__name__}"
                        http.close()
                        http = httpx.Client(timeout=300)
                    t = time.monotonic()
                    with lock:
                        results.append((t - t0, kind, bad, status, t - s0, q, w))
            finally:
                http.close()

        threads = [threading.Thread(target=client, args=(j,), daemon=True) for j in range(a.clients)]
        for th in threads:
            th.start()
        minute, last_rss = 0, t0
        next_row = t0 + a.interval
        while any(th.is_alive() for th in threads):
            time.sleep(0.5)
            now = time.monotonic()
            if server.poll() is not None:
                out["server_exited"] = server.returncode
                stop.set()
                break
            if now - last_rss >= 10:
                last_rss = now
                with lock:
                    n = len(results)
                out["rss_samples"].append(
                    {"seconds": round(now - t0, 1), "requests_done": n, "rss_mb": rss_mb(server.pid)}
                )
            if now >= next_row:
                add_row(out, results, lock, minute, a.interval, server.pid, url)
                minute += 1
                next_row += a.interval
                summarise(out, results, lock, t0)
                write_json(out, json_path)
                if minute % 5 == 0:
                    plot(out, png_path)
        stop.set()
        for th in threads:
            th.join(400)
        if any(r[0] > minute * a.interval for r in results):  # the last, partial row
            add_row(out, results, lock, minute, a.interval, server.pid, url)
        out["finished"] = True
    finally:
        stop.set()
        summarise(out, results, lock, t0 if "t0" in dir() else t_start)
        out["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        write_json(out, json_path)
        plot(out, png_path)
    print(json.dumps(out["summary"], indent=1))


def add_row(out: dict, results: list, lock, minute: int, interval: float, pid: int, url: str) -> None:
    a, b = minute * interval, (minute + 1) * interval
    with lock:
        rows = [r for r in results if a < r[0] <= b]
        total = sum(1 for r in results if r[0] <= b)
    good = [r for r in rows if r[2] is None and r[1] != "abandoned"]
    ok = [r for r in good if r[3] == 200]
    bad = [r for r in rows if r[2] is not None]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
    try:
        health = httpx.get(f"{url}/healthz", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        health = {}
    caches = health.get("caches", {})
    lat = [r[4] for r in ok]
    out["minutes"].append(
        {
            "minute": minute + 1,
            "requests": len(rows),
            "requests_total": total,
            "statuses": statuses,
            "good": len(good),
            "good_failed": sum(1 for r in good if r[3] != 200),
            "bad": len(bad),
            "bad_not_4xx": sum(1 for r in bad if not (isinstance(r[3], int) and 400 <= r[3] < 500)),
            "abandoned": sum(1 for r in rows if r[1] == "abandoned"),
            "p50_seconds": statistics.median(lat) if lat else None,
            "p99_seconds": pct(lat, 0.99),
            "queue_p50_seconds": pct([r[5] for r in ok if r[5] is not None], 0.5),
            "work_p50_seconds": pct([r[6] for r in ok if r[6] is not None], 0.5),
            "work_p99_seconds": pct([r[6] for r in ok if r[6] is not None], 0.99),
            "long_requests": sum(1 for r in ok if r[1] == "long"),
            "rss_mb": rss_mb(pid),
            "server_rss_bytes": health.get("rss_bytes"),
            "embedding_caches": [
                {k: c.get(k) for k in ("embedder", "entries", "bytes", "max_entries", "max_bytes", "evictions")}
                for c in caches.get("embeddings", [])
            ],
            "routers_loaded": caches.get("routers", {}).get("entries"),
            "queue_in_flight": health.get("queue", {}).get("in_flight"),
            "dropped": health.get("dropped"),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    )


def summarise(out: dict, results: list, lock, t0: float) -> None:
    with lock:
        rows = list(results)
    good = [r for r in rows if r[2] is None and r[1] != "abandoned"]
    ok = [r[4] for r in good if r[3] == 200]
    bad = [r for r in rows if r[2] is not None]
    samples = out["rss_samples"]
    at_1000 = next((s["rss_mb"] for s in samples if s["requests_done"] >= 1000), None)
    end = samples[-1]["rss_mb"] if samples else None
    short = [r[4] for r in good if r[3] == 200 and r[1] != "long"]
    s50, s99 = (statistics.median(short), pct(short, 0.99)) if short else (None, None)
    by_kind = {}
    for k in KINDS:
        xs = [r[4] for r in good if r[1] == k and r[3] == 200]
        if xs:
            by_kind[k] = {"requests": len(xs), "p50_seconds": statistics.median(xs), "p99_seconds": pct(xs, 0.99)}
    bad_kinds: dict[str, dict] = {}
    for r in bad:
        d = bad_kinds.setdefault(r[2], {})
        d[str(r[3])] = d.get(str(r[3]), 0) + 1
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
    p50, p99 = (statistics.median(ok), pct(ok, 0.99)) if ok else (None, None)
    out["summary"] = {
        "requests": len(rows),
        "minutes": (max((r[0] for r in rows), default=0)) / 60,
        "statuses": statuses,
        "good_requests": len(good),
        "good_not_200": sum(1 for r in good if r[3] != 200),
        "bad_requests": len(bad),
        "bad_not_4xx": sum(1 for r in bad if not (isinstance(r[3], int) and 400 <= r[3] < 500)),
        "bad_by_kind": bad_kinds,
        "abandoned": sum(1 for r in rows if r[1] == "abandoned"),
        "p50_seconds": p50,
        "p99_seconds": p99,
        "p99_over_p50": p99 / p50 if p50 else None,
        "by_kind": by_kind,
        "rss_mb_at_1000_requests": at_1000,
        "rss_mb_end": end,
        "rss_growth_after_1000": (end / at_1000 - 1) if at_1000 and end else None,
        "rss_mb_max": max((s["rss_mb"] for s in samples if s["rss_mb"] is not None), default=None),
        "short_p50_seconds": s50,
        "short_p99_seconds": s99,
        "short_p99_over_p50": s99 / s50 if s50 else None,
        "goal_rss_growth_after_1000_at_most": 0.10,
        "goal_rss_mb_at_most": RSS_BOUND_MB,
        "goal_short_p99_seconds_at_most": 1.0,
        "goal_p99_over_p50_at_most": 2.5,
    }


if __name__ == "__main__":
    main()
