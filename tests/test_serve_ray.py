"""``masklab serve --ray`` on a real Ray cluster started here on 127.0.0.1 (the fixture of
tests/test_ray_executor.py): two replicas answer the same requests with the same JSON as the
plain server, bad ones with the same 4xx."""

import json
import threading
import time

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402
from conftest import save_tiny_folder  # noqa: E402
from test_compress import REPORT, TRAVEL  # noqa: E402
from test_ray_executor import _free_port, cluster  # noqa: E402, F401  (the module's Ray head)

from masklab.context import ray_serve, serve  # noqa: E402
from masklab.pretrained.models import load  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

BODIES = [
    {"context": REPORT, "question": "Who approved the budget?", "keep": 0.2},
    {"context": TRAVEL, "question": "Where did my sister lose her passport?", "target_tokens": 40},
    {"context": [TRAVEL, REPORT], "question": "Who approved the budget?", "keep": 0.3},
    {"context": REPORT, "question": "  "},
    {"context": REPORT, "question": "Who?", "router": "nope"},
]


def _answers(url):
    out = []
    for body in BODIES:
        r = httpx.post(f"{url}/v1/compress", content=json.dumps(body), timeout=120)
        got = r.json()
        for timing in ("router_seconds", "seconds"):  # the old name of router_seconds stays beside it
            got.pop(timing, None)
        out.append((r.status_code, got))
    return out


def test_two_ray_serve_replicas_answer_as_the_plain_server(cluster, tmp_path):  # noqa: F811
    from ray import serve as ray_serve_api

    folder = save_tiny_folder(tmp_path / "tiny", "llama", max_positions=4096)
    flags = dict(model=str(folder), router="bm25", unit_tokens=400, max_context_bytes=10_000)
    service = serve.Service(load(str(folder), threads=1), serve.ServeConfig(**flags))
    sock = serve.bind("127.0.0.1", 0)
    plain = uvicorn.Server(uvicorn.Config(serve.create_app(service), log_level="warning", access_log=False))
    thread = threading.Thread(target=plain.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not plain.started:
            time.sleep(0.05)
        want = _answers(f"http://127.0.0.1:{sock.getsockname()[1]}")
        cfg = serve.ServeConfig(**flags, host="127.0.0.1", port=_free_port(), replicas=2, replica_cpus=0.5)
        url = ray_serve.deploy(cfg, serve.replica)
        try:
            app = ray_serve_api.status().applications[ray_serve.APP]
            assert app.deployments[ray_serve.APP].replica_states == {"RUNNING": 2}
            got = _answers(url)
            pids = {httpx.get(f"{url}/healthz", timeout=30).json()["pid"] for _ in range(30)}
        finally:
            ray_serve_api.delete(ray_serve.APP)
    finally:
        plain.should_exit = True
        thread.join(10)
        service.close()
        sock.close()
    assert [s for s, _ in want] == [200, 200, 200, 400, 400]
    assert got == want
    assert len(pids) == 2  # both replicas answered


def test_replica_flags_become_ray_serve_options():
    cfg = serve.ServeConfig(replicas=3, replica_cpus=2, threads=2)
    assert ray_serve.deployment_options(cfg) == {
        "name": "masklab",
        "num_replicas": 3,
        "max_ongoing_requests": 16,
        "ray_actor_options": {"num_cpus": 2},
    }
    auto = ray_serve.deployment_options(serve.ServeConfig(min_replicas=1, max_replicas=4, max_queue=10))
    # autoscaling aims at half a replica's bound, so it adds replicas before one is full
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 5.0}
    assert auto["max_ongoing_requests"] == 10 and "num_replicas" not in auto
    with pytest.raises(serve.MasklabError, match="--min-replicas 5 is over --max-replicas 2"):
        ray_serve.deployment_options(serve.ServeConfig(min_replicas=5, max_replicas=2))
    with pytest.raises(serve.MasklabError, match="--replica-cpus 2 and --threads 1 disagree"):
        ray_serve.deployment_options(serve.ServeConfig(replica_cpus=2))
    assert ray_serve.deployment_options(serve.ServeConfig(replica_cpus=0.5))["ray_actor_options"] == {"num_cpus": 0.5}


def test_a_replica_closes_its_service_when_ray_serve_stops_it(tmp_path):
    """Ray Serve stops a replica through its ASGI app's lifespan shutdown (not ``__del__``):
    the app's shutdown closes the service, whose worker ends."""
    from starlette.testclient import TestClient

    folder = save_tiny_folder(tmp_path / "tiny", "llama", max_positions=4096)
    service, app = serve.replica(dict(model=str(folder), router="bm25"), "cpu", "fp32")
    with TestClient(app) as client:  # (runs the lifespan: startup, then shutdown on exit)
        assert client.get("/healthz").json()["status"] == "ok"
        assert service.scheduler._thread.is_alive()
    assert service.scheduler.closed and not service.scheduler._thread.is_alive()
