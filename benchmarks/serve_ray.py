"""``masklab serve --ray``: requests per second with 1 and 2 replicas, and the same JSON as ``masklab serve``.

    python benchmarks/serve_ray.py [--requests 48] [--clients 8] [--json benchmarks/serve_ray.json]

Starts a local Ray (2 CPUs, 127.0.0.1) and deploys the service on Ray Serve (SmolLM2's
tokenizer, masklab's default router, one torch thread and one CPU per replica), and a plain
``masklab serve`` beside it. ``--clients`` concurrent clients send ``--requests`` requests, each
a new document of 3 paragraphs of the corpus (so each is embedded: the CPU-bound case) with a
question, to 1 replica, then 2 (the deployment scaled in place), then 1 again; the ratio is 2
replicas' requests per second over the mean of the two 1-replica phases. Every answer of the
deployment is compared with the plain server's for the same request (every field but the
timings; the scores to float32 rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from serve_sched import same, start, wait_up  # noqa: E402
from serve_soak import Mix, corpus, free_port  # noqa: E402

from masklab.context.router import DEFAULT_ROUTER  # noqa: E402
from masklab.lab import revision  # noqa: E402


def phase(url: str, bodies: list[dict], clients: int) -> tuple[float, list[dict]]:
    http = [httpx.Client(timeout=300) for _ in range(clients)]

    def send(k):
        r = http[k % clients].post(f"{url}/v1/compress", json=bodies[k])
        r.raise_for_status()
        return r.json()

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(send, range(len(bodies))))
    rate = len(bodies) / (time.monotonic() - t0)
    for c in http:
        c.close()
    return rate, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48, help="requests per phase (default 48)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--json", default=str(HERE / "serve_ray.json"), help="where to write the figures")
    a = ap.parse_args()
    os.environ.update(
        {
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    import ray
    from ray import serve

    from masklab.context import ray_serve
    from masklab.context.serve import ServeConfig, replica

    where, texts = corpus()
    mix = Mix(texts, 65_536, 1, 0)
    rng = random.Random(0)
    out = {
        "command": "python benchmarks/serve_ray.py " + " ".join(sys.argv[1:]),
        "router": DEFAULT_ROUTER,
        "corpus": where,
        "clients": a.clients,
        "requests_per_phase": a.requests,
        "code": revision.code_hash("masklab.context.ray_serve"),
        "code_ast": revision.code_ast("masklab.context.ray_serve"),
        "git_rev": revision.git_rev(),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs (load average below); a local Ray with 2 "
        "CPUs; one torch thread and one CPU per replica; the clients and the plain server on the same cores",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "phases": [],
    }
    plain, plain_url = start("plain", [], Path("/tmp"))
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", _node_ip_address="127.0.0.1"
    )
    try:
        wait_up(plain, plain_url)
        cfg = ServeConfig(host="127.0.0.1", port=free_port(), replicas=1, max_queue=64)
        agree = True
        for replicas in (1, 2, 1):
            t0 = time.monotonic()
            url = ray_serve.deploy(ServeConfig(**{**cfg.__dict__, "replicas": replicas}), replica)
            up = time.monotonic() - t0
            bodies = []
            for i in range(a.requests):
                ctx = mix.distinct(rng, len(out["phases"]) * 10**4 + i, 3)
                bodies.append({"context": ctx, "question": mix.question(rng, ctx), "keep": 0.25})
            phase(url, bodies[:2], 2)  # (warm: each replica's first request)
            rate, got = phase(url, bodies, a.clients)
            _, want = phase(plain_url, bodies, a.clients)
            agree &= all(same(x, y) for x, y in zip(got, want))
            out["phases"].append({"replicas": replicas, "requests_per_second": rate, "deploy_seconds": up})
            print(f"{replicas} replica(s): {rate:.2f} requests/s (deployed in {up:.0f} s)", flush=True)
        one = statistics.mean(p["requests_per_second"] for p in out["phases"] if p["replicas"] == 1)
        out["one_replica_requests_per_second"] = one
        out["two_replicas_requests_per_second"] = out["phases"][1]["requests_per_second"]
        out["ratio"] = out["two_replicas_requests_per_second"] / one
        out["same_json_as_masklab_serve"] = agree
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            plain.terminate()
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "phases"}, indent=1))


if __name__ == "__main__":
    main()
