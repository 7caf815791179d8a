"""--executor ray against a real Ray cluster started here on 127.0.0.1 (2 CPUs, shared by
every test in this module): same numbers as --executor local, a worker killed mid-run is
retried and resumes from its checkpoint, a bad address is one clear error."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from masklab import cli
from masklab.lab import executors
from masklab.lab.executors import LocalExecutor, RayExecutor
from masklab.lab.runner import MasklabError, read_json, run_study
from masklab.lab.studies.gotu import Config, specs_for

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one cluster: every test here on one worker

TINY = dict(
    tasks=["2parity"],
    methods=["vanilla", "mask"],
    seeds=[0, 1],
    steps=30,
    evals=3,
    width=16,
    depth=1,
    heads=2,
    batch=32,
)
# loopback only: Ray would otherwise swap 127.0.0.1 for this machine's outward address, and a
# token left in ~/.ray by another Ray would switch on authentication
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """``ray start --head`` on 127.0.0.1 in its own session; every process of it is ended afterwards."""
    ray = pytest.importorskip("ray")
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    tmp = tempfile.mkdtemp(prefix="mlray")  # short: Ray's unix sockets live under it
    port = _free_port()
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus",
        "2",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--temp-dir",
        tmp,
    ]
    with open(Path(tmp) / "start.log", "w") as log:
        head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.time() > deadline:
                    raise RuntimeError("ray start failed: " + (Path(tmp) / "start.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        from ray._private import ray_constants  # read from the environment when ray was first imported

        saved_cluster, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
        RayExecutor(address).connect()
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.terminate()  # `ray start --block` stops its processes on SIGTERM
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        # anything of this session still alive (never `ray stop`: it stops every Ray on the machine)
        left = subprocess.run(["ps", "-s", str(head.pid), "-o", "pid="], capture_output=True, text=True).stdout.split()
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if os.environ.get("MASKLAB_KEEP_RAY_TMP") is None:
            subprocess.run(["rm", "-rf", tmp])
        if "saved_cluster" in locals():
            ray_constants.ENABLE_RAY_CLUSTER = saved_cluster
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _strip(runs):
    # seconds differ; git_rev too if the checkout changes while the test runs (workers read it)
    return [{k: v for k, v in r.items() if k not in ("seconds", "git_rev")} for r in runs]


def test_ray_runs_give_the_same_results_as_local(cluster, tmp_path):
    specs = specs_for(Config(**TINY))
    # the local runs in this process (local parallel runs equal serial ones: tests/test_runner.py)
    local = run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path / "local", jobs=1, progress=False)
    remote = run_study(
        "gotu",
        {},
        specs,
        "masklab.lab.studies.gotu:run_one",
        tmp_path / "ray",
        progress=False,
        executor=RayExecutor(cluster),
    )
    assert len(remote["runs"]) == 4
    assert _strip(remote["runs"]) == _strip(local["runs"])  # every metric and curve, exactly
    assert remote["summary"] == local["summary"]
    for s in specs:  # each task wrote its own run file, and the gathered record is that file
        assert read_json(tmp_path / "ray" / "runs" / f"{s.key}.json") == next(
            r for r in remote["runs"] if r["spec"] == s.as_dict()
        )
    assert read_json(tmp_path / "ray" / "results.json")["environment"]["executor"] == "RayExecutor"
    # the same command again resumes: nothing is resubmitted
    again = run_study(
        "gotu",
        {},
        specs,
        "masklab.lab.studies.gotu:run_one",
        tmp_path / "ray",
        progress=False,
        executor=RayExecutor(cluster),
    )
    assert [r["seconds"] for r in again["runs"]] == [r["seconds"] for r in remote["runs"]]


def _kill_first_worker_mid_run(out: Path, key: str, killed: dict) -> None:
    """Wait until the run has written a mid-run checkpoint, then SIGKILL the Ray worker running it."""
    ckpt = out / "ckpt" / key / "ckpt.json"
    deadline = time.time() + 120
    while time.time() < deadline and not ckpt.exists():
        time.sleep(0.02)
    if not ckpt.exists():
        return
    for pid in subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines():
        pid, _, args = pid.strip().partition(" ")
        if args.startswith(f"ray::masklab:{key}"):  # Ray names a busy worker after its task
            killed["step"] = read_json(ckpt)["step"]
            os.kill(int(pid), signal.SIGKILL)
            killed["pid"] = int(pid)
            return


def test_worker_killed_mid_run_is_retried_and_gives_the_same_numbers(cluster, tmp_path):
    cfg = Config(**{**TINY, "methods": ["mask"], "seeds": [0], "steps": 300, "evals": 10})
    specs = specs_for(cfg)
    local = run_study(
        "gotu",
        {},
        specs,
        "masklab.lab.studies.gotu:run_one",
        tmp_path / "local",
        jobs=1,
        progress=False,
        executor=LocalExecutor(1),
    )
    killed: dict = {}
    killer = threading.Thread(target=_kill_first_worker_mid_run, args=(tmp_path / "ray", specs[0].key, killed))
    killer.start()
    remote = run_study(
        "gotu",
        {},
        specs,
        "masklab.lab.studies.gotu:run_one",
        tmp_path / "ray",
        progress=False,
        executor=RayExecutor(cluster),
    )
    killer.join()
    assert "pid" in killed, "the run finished before its worker could be killed"
    assert 0 < killed["step"] < 300
    assert _strip(remote["runs"]) == _strip(local["runs"])


def test_bad_address_is_one_clear_error(cluster, tmp_path, capsys):
    port = _free_port()  # nobody listens there
    code = cli.main(
        [
            "gotu",
            "--quick",
            "--seed",
            "0",
            "--steps",
            "5",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--executor",
            "ray",
            "--ray-address",
            f"127.0.0.1:{port}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("masklab: error: cannot connect to the Ray cluster at") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    with pytest.raises(MasklabError, match="HOST:PORT"):
        RayExecutor("no-port-here").connect()


def test_cli_executor_ray_uses_the_cluster_and_writes_the_usual_results(cluster, tmp_path, capsys):
    argv = [
        "gotu",
        "--quick",
        "--task",
        "2parity",
        "--method",
        "vanilla,mask",
        "--seed",
        "0",
        "--steps",
        "20",
        "--no-progress",
        "--executor",
        "ray",
        "--ray-address",
        cluster,
    ]
    assert cli.main([*argv, "--out", str(tmp_path / "ray")]) == 0
    assert cli.main([*argv[:-4], "--jobs", "1", "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()
    a, b = read_json(tmp_path / "ray" / "results.json"), read_json(tmp_path / "local" / "results.json")
    assert _strip(a["runs"]) == _strip(b["runs"]) and len(a["runs"]) > 0
    assert a["environment"]["executor"] == "RayExecutor" and b["environment"]["executor"] == "LocalExecutor"
    assert executors.current(1).__class__ is LocalExecutor  # the choice lasted one command


def test_without_ray_executor_ray_is_one_clear_error_with_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code = cli.main(["gotu", "--quick", "--seed", "0", "--out", str(tmp_path), "--executor", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("masklab: error: --executor ray needs Ray") and "pip install 'masklab[ray]'" in err
    assert not (tmp_path / "runs").exists()
