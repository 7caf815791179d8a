"""``masklab serve --ray``: the same app on Ray Serve, in replicas (docs/serve.md).

Each replica is a Ray actor that loads the model and the default router and runs the app of
``masklab.context.serve.create_app`` over its own ``Service``
(its worker batches and slices as the plain server's does); Ray Serve's HTTP proxy listens on
``--host:--port`` and spreads the requests over the replicas. ``--replicas N`` fixes their
number; ``--max-replicas`` lets Ray Serve autoscale between ``--min-replicas`` and it on the
requests in flight per replica (half a replica's ``--max-queue`` is the target, so replicas are
added before one is full). Ray sends a replica at most ``--max-queue`` requests at once; the rest
wait in Ray's proxy, and ``--request-seconds`` bounds a request end to end there too (Ray's proxy
answers 408 past it). A replica reserves ``--replica-cpus`` CPUs and runs ``--threads`` torch
threads: the two must agree. A replica's service is closed by the app's lifespan shutdown, which
Ray Serve runs when it stops the replica. Only the config (a dict of flags) crosses Ray; each
replica builds everything else itself.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time

from masklab.util.errors import MasklabError

APP = "masklab"


def import_serve():
    """``ray`` and ``ray.serve``, or one clear error naming the install command."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise MasklabError(f"masklab serve --ray needs Ray Serve ({e}): pip install 'masklab[ray,serve]'") from None
    return ray, serve


def deployment_options(cfg) -> dict:
    """Ray Serve's options for ``cfg``'s replicas: a fixed ``num_replicas``, or an
    ``autoscaling_config`` when ``--max-replicas`` is given, whose target of requests in flight
    per replica is half of ``--max-queue`` (below the bound, so autoscaling adds replicas before
    they are full); each replica gets at most ``--max-queue`` requests at once (more wait in Ray)
    and reserves ``--replica-cpus``, which must match its ``--threads`` (a fraction of a CPU for
    one thread)."""
    if cfg.max_replicas is not None and cfg.min_replicas > cfg.max_replicas:
        raise MasklabError(f"--min-replicas {cfg.min_replicas} is over --max-replicas {cfg.max_replicas}")
    if math.ceil(cfg.replica_cpus) != cfg.threads:
        raise MasklabError(
            f"--replica-cpus {cfg.replica_cpus:g} and --threads {cfg.threads} disagree: a replica runs --threads "
            "torch threads on the CPUs Ray reserves for it, so give both the same number"
        )
    scale = (
        {
            "autoscaling_config": {
                "min_replicas": cfg.min_replicas,
                "max_replicas": cfg.max_replicas,
                "target_ongoing_requests": cfg.max_queue / 2,
            }
        }
        if cfg.max_replicas is not None
        else {"num_replicas": cfg.replicas}
    )
    return {
        "name": APP,
        **scale,
        "max_ongoing_requests": cfg.max_queue,
        "ray_actor_options": {"num_cpus": cfg.replica_cpus},
    }


def application(cfg, build, device: str = "cpu", precision: str = "fp32"):
    """The Ray Serve application of ``cfg`` (bound, ready for ``serve.run``); ``build(flags,
    device, precision) -> (service, app)`` makes a replica's service and app
    (:func:`masklab.context.serve.replica`; passed in, as this module is imported by it)."""
    _, serve = import_serve()

    @serve.ingress()
    class Masklab:
        """One replica: the model loaded, a Service and its app (built after the constructor)."""

        def __init__(self, flags: dict, device: str, precision: str) -> None:
            self.service, self.asgi = build(flags, device, precision)

        def __serve_build_asgi_app__(self):
            return self.asgi  # (its lifespan's shutdown closes the service: create_app)

    options = deployment_options(cfg)
    if str(device).startswith("cuda"):
        options["ray_actor_options"]["num_gpus"] = 1
    return serve.deployment(Masklab, **options).bind(dataclasses.asdict(cfg), str(device), precision)


def deploy(cfg, build, device: str = "cpu", precision: str = "fp32") -> str:
    """Deploy ``cfg``'s application on the connected Ray cluster (Ray Serve's proxy on
    ``--host:--port``, a request's end-to-end time bounded by ``--request-seconds``, Ray's queue
    included) and wait until every replica is up; its URL."""
    _, serve = import_serve()
    serve.start(http_options={"host": cfg.host, "port": cfg.port, "request_timeout_s": cfg.request_seconds})
    serve.run(application(cfg, build, device, precision), name=APP, route_prefix="/", blocking=False)
    return f"http://{cfg.host}:{cfg.port}"


def connect(address: str | None):
    """``ray.init`` on ``address`` (None: a new local Ray), or one clear error."""
    ray, _ = import_serve()
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MasklabError(f"cannot connect to the Ray cluster at {address or 'a new local Ray'}: {first}") from None
    return ray


def _stop(signum, frame):
    raise KeyboardInterrupt


def main(cfg, build, device, precision: str) -> int:
    ray = connect(cfg.ray_address)
    _, serve = import_serve()
    signal.signal(signal.SIGTERM, _stop)  # a plain kill ends it as Ctrl-C does: the application deleted, Ray stopped
    try:
        url = deploy(cfg, build, str(device), precision)
        how = (
            f"{cfg.min_replicas} to {cfg.max_replicas} replicas (autoscaled)"
            if cfg.max_replicas is not None
            else f"{cfg.replicas} replica{'s' * (cfg.replicas > 1)}"
        )
        print(
            f"masklab serve --ray: {cfg.model} and router {cfg.router} on {how}; listening on {url} "
            "(POST /v1/compress, GET /healthz); Ctrl-C stops it",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            serve.delete(APP)
        finally:
            ray.shutdown()
    return 0
