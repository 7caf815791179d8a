"""The GPU check of issue 30: one prepared script, at most 8 minutes on one GPU, writing
``benchmarks/device_check.json`` (what docs/gpu.md quotes and generates from).

    python scripts/device_check.py                        # on a CUDA machine: everything
    python scripts/device_check.py --dry-run              # print the plan, run nothing
    python scripts/device_check.py --device cpu --tiny    # every code path, small, on the CPU

Steps, each with its own time limit (a step that fails or times out is recorded as such and
the next one runs, so one file always comes back):

1. ``gpu_tests``: ``pytest -m gpu`` over the test files that hold ``gpu`` tests (every CUDA
   path of the attention core against the math path, float32, tolerances stated in
   tests/test_attention_flex.py); passed / failed / skipped counts and the failures' names.
2. ``attention``: forward + backward of attention with a learnable per-head prior
   ``(H, T, T)`` at T = 64 / 256 / 1024 / 4096 (B = 16384 / T, 8 heads of 64), interleaved
   within every repetition: ``plain`` (SDPA without a mask: its flash kernel, the
   denominator), ``prior`` (the core's FlexAttention path, :func:`masklab.priors.attention.flex_attention_bias`,
   compiled), ``math`` (SDPA with the learnable mask: its math kernel, the reference) and
   ``frozen`` (the same prior without gradient through SDPA's memory-efficient kernel).
   Medians of CUDA-event times, their ratios to ``plain``, peak memory per path, and the
   largest difference of the prior path's output and prior gradient from ``math``.
   On the CPU (``--device cpu``) the prior path is the blocked path (FlexAttention has no
   CPU backward).
3. ``gotu_quick``: ``masklab reproduce gotu --quick`` on the device and on the CPU, at the
   same time (two processes; the CPU one uses the CPUs): wall seconds of each and, per run and
   metric, the difference of the device's number from the CPU's, against the stated
   tolerances (:data:`GOTU_TOL`).
4. ``longctx``: ``masklab longctx`` at 8192 tokens on SmolLM2-135M and 32768 on Gemma 3 270M,
   a few examples, no routers or presses: wall seconds, the study's own seconds / prefill /
   memory figures and accuracy; the GPU's peak memory when the study records it. Needs the
   models installed (scripts/install-pretrained.sh) and the long-context code wired to
   ``--device`` (issue 30's report lists what): until then the step records the error.

``--tiny`` shrinks every step (lengths 16 / 32, a 20-step gotu on one task and method, no
long-context runs) so the whole script runs in about a minute on a CPU; the tests use it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from masklab.util import device as devices  # noqa: E402
from masklab.lab import revision  # noqa: E402
from masklab.util.errors import MasklabError  # noqa: E402
from masklab.util.files import read_json, write_json  # noqa: E402

STEPS = ("gpu_tests", "attention", "gotu_quick", "longctx")
GPU_TEST_FILES = ["tests/test_attention_flex.py", "tests/test_device.py"]
LENGTHS = (64, 256, 1024, 4096)
TINY_LENGTHS = (16, 32)
TOKENS = 16384  # B = TOKENS / T
HEADS, HEAD_DIM = 8, 64
# gotu on the device vs the CPU, per metric: the largest |device - cpu| that counts as equal.
# Accuracies are over 4096-8192 points; the runs train 600 steps from the same draws, so
# float order differences may move a handful of points' signs.
GOTU_TOL = {
    "unseen_acc": 0.02,
    "full_acc": 0.02,
    "seen_acc": 0.02,
    "mdi_agreement": 0.02,
    "prior_mass_final": 0.02,
    "prior_mass_all_final": 0.02,
    "mask_drift": 0.02,
    "train_mse": 0.01,
    "unseen_mse": 0.05,
    "u": 0.05,
}
LONGCTX = [("smollm2-135m", 8192), ("gemma3-270m", 32768)]
LONGCTX_EXAMPLES = 3
GOTU_TINY = [
    "gotu",
    "--quick",
    "--task",
    "2parity",
    "--method",
    "mask",
    "--steps",
    "20",
    "--evals",
    "2",
    "--width",
    "16",
    "--depth",
    "1",
    "--heads",
    "2",
    "--batch",
    "32",
]
# seconds per step (the four add up to at most 8 minutes with the start-up)
LIMITS = {"gpu_tests": 180, "attention": 100, "gotu_quick": 120, "longctx": 70}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="the device under test: cuda (default), cuda:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="small sizes: every code path in about a minute on a CPU")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (steps, sizes, commands) and run nothing")
    ap.add_argument("--skip", default="", help=f"comma-separated steps to leave out ({', '.join(STEPS)})")
    ap.add_argument(
        "--reps", type=int, default=None, help="timed repetitions per attention length (default 7; --tiny 3)"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="the JSON file (default benchmarks/device_check.json; with --tiny "
        "or --device cpu, runs/device_check.json, so a CPU try never replaces the GPU's file)",
    )
    args = ap.parse_args(argv)
    args.skip = [s for s in args.skip.split(",") if s]
    unknown = [s for s in args.skip if s not in STEPS]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    if args.reps is None:
        args.reps = 3 if args.tiny else 7
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.out is None:
        cpu_try = args.tiny or args.device == "cpu"
        args.out = str(ROOT / ("runs/device_check.json" if cpu_try else "benchmarks/device_check.json"))
    return args


def plan(args: argparse.Namespace) -> list[dict]:
    """The steps this invocation runs, with their sizes and commands (what ``--dry-run`` prints)."""
    steps = []
    if "gpu_tests" not in args.skip:
        steps.append({"step": "gpu_tests", "limit_s": LIMITS["gpu_tests"], "command": shlex.join(pytest_command(args))})
    if "attention" not in args.skip:
        steps.append(
            {
                "step": "attention",
                "limit_s": LIMITS["attention"],
                "lengths": list(lengths(args)),
                "tokens": TOKENS if not args.tiny else 64,
                "heads": HEADS if not args.tiny else 2,
                "head_dim": HEAD_DIM if not args.tiny else 16,
                "reps": args.reps,
            }
        )
    if "gotu_quick" not in args.skip:
        steps.append(
            {
                "step": "gotu_quick",
                "limit_s": LIMITS["gotu_quick"],
                "commands": [
                    shlex.join(gotu_command(args, args.device, "DIR")),
                    shlex.join(gotu_command(args, "cpu", "DIR")),
                ],
            }
        )
    if "longctx" not in args.skip and not args.tiny:
        steps.append(
            {
                "step": "longctx",
                "limit_s": LIMITS["longctx"],
                "commands": [shlex.join(longctx_command(args, m, n, "DIR")) for m, n in LONGCTX],
            }
        )
    return steps


def lengths(args: argparse.Namespace) -> tuple[int, ...]:
    return TINY_LENGTHS if args.tiny else LENGTHS


def masklab_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "masklab", *argv]


def pytest_command(args: argparse.Namespace) -> list[str]:
    # -rfE: the failures' and errors' names in the summary (-q prints one dot per test, so a
    # timed-out run still shows how far it got)
    return [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-p", "no:cacheprovider", *GPU_TEST_FILES]


def gotu_command(args: argparse.Namespace, device: str, out: str) -> list[str]:
    base = GOTU_TINY if args.tiny else ["reproduce", "gotu", "--quick"]
    return masklab_cmd(*base, "--device", device, "--out", out, "--no-progress")


def longctx_command(args: argparse.Namespace, model: str, length: int, out: str) -> list[str]:
    return masklab_cmd(
        "longctx",
        "--model",
        model,
        "--length",
        str(length),
        "--tasks",
        "niah",
        "--keep",
        "0.25",
        "--examples",
        str(LONGCTX_EXAMPLES),
        "--routers",
        "none",
        "--compare",
        "none",
        "--device",
        args.device,
        "--out",
        out,
        "--no-progress",
    )


def run_command(cmd: list[str], limit: float, keep: tuple[str, ...] = ()) -> dict:
    """Run ``cmd`` from the repository root: exit code (``"timeout"`` past ``limit``), wall
    seconds, the last lines of its output (kept in files, so a timed-out command's output so
    far still comes back); ``lines``: every output line starting with one of ``keep``."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True, env=env)
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "command": " ".join(cmd[2:] if cmd[1] == "-m" else cmd),
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 2),
        "stdout_tail": stdout.strip().splitlines()[-3:],
        "stderr_tail": stderr.strip().splitlines()[-3:],
        **({"lines": [x for x in stdout.splitlines() if x.startswith(keep)]} if keep else {}),
    }


# ----------------------------------------------------------------------------- 1. gpu tests


def gpu_tests(args: argparse.Namespace) -> dict:
    res = run_command(pytest_command(args), LIMITS["gpu_tests"], keep=("FAILED", "ERROR"))
    res["failures"] = res.pop("lines")
    return {**res, **pytest_counts(" ".join(res["stdout_tail"][-1:]))}


def pytest_counts(summary: str) -> dict[str, int]:
    """``'3 failed, 20 passed, 35 skipped in 6.5s'`` -> ``{"passed": 20, "failed": 3, ...}``."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "deselected", "errors")}
    words = summary.replace(",", " ").split()
    for n, word in zip(words, words[1:]):
        word = "errors" if word.startswith("error") else word
        if n.isdigit() and word in counts:
            counts[word] = int(n)
    return counts


# ----------------------------------------------------------------------------- 2. attention


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Timer:
    """Seconds of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev

    def __call__(self, fn) -> float:
        if self.dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize(self.dev)
            return a.elapsed_time(b) / 1000
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def attention_paths(dev: torch.device, T: int, tokens: int, heads: int, head_dim: int) -> tuple[dict, dict]:
    """The callables (forward + backward) of every path at length ``T``, and the inputs."""
    from masklab.priors.attention import BlockedBiasAttention, flex_attention_bias

    B = max(1, tokens // T)
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(B, heads, T, head_dim, generator=g).to(dev).requires_grad_() for _ in range(3))
    m = torch.randn(heads, T, T, generator=g).to(dev).requires_grad_()
    grad = torch.randn(B, heads, T, head_dim, generator=g).to(dev)

    def prior() -> torch.Tensor:
        return F.logsigmoid(m)  # what a MaskPrior returns: the learnable term

    def clear() -> None:
        for t in (q, k, v, m):
            t.grad = None

    def plain():
        clear()
        F.scaled_dot_product_attention(q, k, v).backward(grad)

    def fused_prior():
        clear()
        y = (
            flex_attention_bias(q, k, v, prior(), None)
            if dev.type == "cuda"
            else BlockedBiasAttention.apply(q, k, v, prior(), None)
        )
        y.backward(grad)
        return y

    def math():
        clear()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=prior()[None])
        y.backward(grad)
        return y

    frozen_mask = prior().detach()[None]

    def frozen():
        clear()
        F.scaled_dot_product_attention(q, k, v, attn_mask=frozen_mask).backward(grad)

    return {"plain": plain, "prior": fused_prior, "math": math, "frozen": frozen}, {"B": B, "m": m, "q": q}


def attention(args: argparse.Namespace, dev: torch.device) -> dict:
    tokens, heads, head_dim = (64, 2, 16) if args.tiny else (TOKENS, HEADS, HEAD_DIM)
    rows = []
    t_end = time.perf_counter() + LIMITS["attention"]
    for T in lengths(args):
        row: dict = {"T": T}
        try:
            paths, inputs = attention_paths(dev, T, tokens, heads, head_dim)
            row["B"] = inputs["B"]
            # agreement of the prior path with the math path (output and prior gradient), float32
            y0 = paths["math"]()
            g0 = inputs["m"].grad.clone()
            y1 = paths["prior"]()
            g1 = inputs["m"].grad.clone()
            row["prior_vs_math_max_abs_y"] = (y1 - y0).abs().max().item()
            row["prior_vs_math_max_rel_grad"] = ((g1 - g0).abs().max() / g0.abs().max().clamp_min(1e-30)).item()
            del y0, y1, g0, g1
            timer = Timer(dev)
            times: dict[str, list[float]] = {name: [] for name in paths}
            peak: dict[str, float] = {}
            for name, fn in paths.items():  # warm-up (compiles the flex kernel) and peak memory
                fn()
                if dev.type == "cuda":
                    _sync(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
                    fn()
                    _sync(dev)
                    peak[name] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
            for _ in range(args.reps):  # interleaved: machine noise hits every path alike
                for name, fn in paths.items():
                    times[name].append(timer(fn))
                if time.perf_counter() > t_end:
                    row["note"] = "stopped early: the step's time limit"
                    break
            med = {name: statistics.median(ts) for name, ts in times.items()}
            row["ms"] = {name: round(1000 * s, 4) for name, s in med.items()}
            row["ratio_to_plain"] = {name: round(s / med["plain"], 3) for name, s in med.items() if name != "plain"}
            row["peak_mib"] = peak
        except torch.OutOfMemoryError as e:
            row["error"] = f"out of memory: {str(e).splitlines()[0]}"
        except Exception as e:  # recorded, and the next length runs
            row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        if time.perf_counter() > t_end:
            break
    long = [r for r in rows if r["T"] >= 256 and "ratio_to_plain" in r]
    return {
        "path": "flex (compiled)" if dev.type == "cuda" else "blocked (CPU: FlexAttention has no backward)",
        # float32 throughout: SDPA's fused kernel for float32 on CUDA is the memory-efficient
        # one (its flash kernel takes fp16/bf16 only), so "plain" is that kernel without a mask
        "dtype": "float32",
        "tokens": tokens,
        "heads": heads,
        "head_dim": head_dim,
        "reps": args.reps,
        "rows": rows,
        "goal_prior_le_1.2x_plain_at_T_ge_256": (
            all(r["ratio_to_plain"]["prior"] <= 1.2 for r in long) if long else None
        ),
    }


# ----------------------------------------------------------------------------- 3. gotu --quick


def compare_runs(dev_res: dict, cpu_res: dict, tol: dict[str, float] = GOTU_TOL) -> dict:
    """Per metric of :data:`GOTU_TOL`: the largest |device - cpu| over the runs (matched by
    task, method, seed) and whether it is within the tolerance."""
    key = lambda r: (r["task"], r["method"], r["seed"])  # noqa: E731
    cpu = {key(r): r["metrics"] for r in cpu_res["runs"]}
    diffs: dict[str, float] = {}
    for r in dev_res["runs"]:
        other = cpu.get(key(r))
        if other is None:
            continue
        for name in tol:
            a, b = r["metrics"].get(name), other.get(name)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                diffs[name] = max(diffs.get(name, 0.0), abs(a - b))
    return {
        "max_abs_diff": {k: round(v, 6) for k, v in diffs.items()},
        "tolerance": {k: tol[k] for k in diffs},
        "within": all(v <= tol[k] for k, v in diffs.items()) if diffs else None,
        "runs_compared": sum(key(r) in cpu for r in dev_res["runs"]),
    }


def gotu_quick(args: argparse.Namespace, work: Path) -> dict:
    outs = {"device": work / "gotu-device", "cpu": work / "gotu-cpu"}
    cmds = {
        "device": gotu_command(args, args.device, str(outs["device"])),
        "cpu": gotu_command(args, "cpu", str(outs["cpu"])),
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    procs = {
        k: subprocess.Popen(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        for k, c in cmds.items()
    }
    res: dict = {"commands": {k: " ".join(c[3:]) for k, c in cmds.items()}, "concurrent": True}
    for k, p in procs.items():
        try:
            _, err = p.communicate(timeout=max(1.0, LIMITS["gotu_quick"] - (time.perf_counter() - t0)))
            res[f"{k}_rc"] = p.returncode
            if p.returncode:
                res[f"{k}_error"] = err.strip().splitlines()[-1:] if err.strip() else []
        except subprocess.TimeoutExpired:
            p.kill()
            res[f"{k}_rc"] = "timeout"
        results = outs[k] / "results.json"
        if results.exists():
            r = read_json(results)
            res[f"{k}_seconds"] = round(sum(run["seconds"] for run in r["runs"]), 2)
            res[f"{k}_environment"] = {
                n: r["environment"].get(n) for n in ("device", "device_name", "precision", "jobs")
            }
    if all((outs[k] / "results.json").exists() for k in outs):
        res.update(compare_runs(read_json(outs["device"] / "results.json"), read_json(outs["cpu"] / "results.json")))
    res["wall_seconds"] = round(time.perf_counter() - t0, 2)
    return res


# ----------------------------------------------------------------------------- 4. longctx


def longctx(args: argparse.Namespace, work: Path) -> list[dict]:
    rows = []
    per_run = LIMITS["longctx"] / len(LONGCTX)
    for model, length in LONGCTX:
        out = work / f"longctx-{model}-{length}"
        res = run_command(longctx_command(args, model, length, str(out)), per_run)
        row = {"model": model, "length": length, "examples": LONGCTX_EXAMPLES, **res}
        if (out / "results.json").exists():
            r = read_json(out / "results.json")
            row["summary"] = r["summary"]
            row["environment"] = {n: r["environment"].get(n) for n in ("device", "device_name", "precision")}
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = plan(args)
    if args.dry_run:
        print(json.dumps({"device": args.device, "tiny": args.tiny, "out": args.out, "steps": steps}, indent=2))
        return 0
    dev = devices.resolve(args.device)  # one clear error on a machine without the device
    report: dict = {
        "script": "scripts/device_check.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "tiny": args.tiny,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_rev": revision.git_rev(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **devices.describe(dev, "fp32"),
        "steps": {},
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        work = Path(tmp)
        for step in steps:
            name = step["step"]
            print(f"device_check: {name} ...", file=sys.stderr, flush=True)
            s0 = time.perf_counter()
            try:
                if name == "gpu_tests":
                    out = gpu_tests(args)
                elif name == "attention":
                    out = attention(args, dev)
                elif name == "gotu_quick":
                    out = gotu_quick(args, work)
                else:
                    out = {"runs": longctx(args, work)}
            except Exception as e:  # one step's failure is recorded; the others still run
                out = {"error": f"{type(e).__name__}: {e}"}
            out["step_seconds"] = round(time.perf_counter() - s0, 2)
            report["steps"][name] = out
            write_json(
                Path(args.out), {**report, "total_seconds": round(time.perf_counter() - t0, 2)}
            )  # after every step
    report["total_seconds"] = round(time.perf_counter() - t0, 2)
    write_json(Path(args.out), report)
    print(f"device_check: wrote {args.out} in {report['total_seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except MasklabError as e:
        print(f"masklab: error: {e}", file=sys.stderr)
        raise SystemExit(2)
