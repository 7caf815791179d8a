"""Markdown tables and matplotlib figures from a results dict (schema: docs/design.md).

* :func:`markdown_table` - the summary, ``mean ± std`` per metric (the mean alone for one
  run), ``n`` and the paper's numbers beside;
* :func:`write_markdown` - ``results.md``: command, table, notes, environment;
* :func:`plot_curves` - one panel per task, mean curve per method with a min-max band over seeds;
* :func:`plot_bars` - one panel per task, a bar per method with every seed as a dot;
* :func:`save_figure` - atomic PNG write for any other figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from masklab.util.files import atomic_write_text  # noqa: E402


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def is_p_value(name: str) -> bool:
    """A metric or key named ``p`` or ``p_...`` (``p_full``, ``p_top_vs_bm25``) holds a p-value."""
    return name == "p" or name.startswith("p_")


def fmt_p(value: Any, digits: int = 3) -> str:
    """A p-value: as :func:`fmt`, but one that rounds to zero prints ``< 0.001`` (for 3 digits),
    not ``0.000``: a test never shows p = 0."""
    if isinstance(value, (int, float)) and 0 <= value < 0.5 * 10**-digits:
        return f"< {10**-digits:.{digits}f}"
    return fmt(value, digits)


def paper_cell(paper: list[dict], task: str, method: str) -> str:
    """The paper's numbers for one (task, method), e.g. ``full_acc 0.75``."""
    cells = [f"{p['metric']} {fmt(p['value'])}" for p in paper if p.get("task") == task and p.get("method") == method]
    return "; ".join(cells) or "-"


def stat_cell(row: dict, metric: str, digits: int = 3) -> str:
    """``mean ± std`` of ``metric`` in a summary row; the mean alone when there is no std
    (a single run: no spread was measured, so none is printed); ``-`` when missing."""
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(summary: list[dict], paper: list[dict] | None, metrics: list[str], digits: int = 3) -> str:
    """One row per (task, model, method): :func:`stat_cell` of each metric, ``n`` and (when
    ``paper`` is not None) the paper's numbers. The model column is there only when the rows
    have one (studies of real LMs)."""
    models = any("model" in row for row in summary)
    head = ["task", *(["model"] if models else []), "method", "n", *metrics, *(["paper"] if paper is not None else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary:
        cells = [row["task"], *([row.get("model", "-")] if models else []), row["method"], str(row["n"])]
        cells += [stat_cell(row, m, digits) for m in metrics]
        if paper is not None:
            cells.append(paper_cell(paper, row["task"], row["method"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def code_note(results: dict) -> str:
    """A warning when the runs of ``results`` were made by more than one code hash
    (:mod:`masklab.lab.revision`; by ``code_ast`` where the results count it, so a comment edit
    between runs is no warning), else ``""``."""
    counts = results.get("code_ast") or results.get("code") or {}
    if len(counts) <= 1:
        return ""
    parts = ", ".join(f"{n} by {code}" for code, n in counts.items())
    return (
        f"**Warning: this table mixes runs made by different code** ({parts}); "
        "rerun without `--keep-old-runs` to redo the old ones."
    )


def write_markdown(
    results: dict, out: Path, metrics: list[str], command: str, notes: str = "", figures: list[str] = ()
) -> None:
    """Write ``out/results.md``."""
    parts = [
        f"# {results['study']}",
        "",
        f"Regenerate with: `{command}`",
        "",
        markdown_table(results["summary"], results["paper"], metrics),
        "",
        "Values are mean ± sample std over seeds (n runs; the mean alone when n = 1). "
        "The paper column gives the authors' reported numbers.",
    ]
    if notes:
        parts += ["", notes.strip()]
    for fig in figures:
        parts += ["", f"![{fig}]({fig})"]
    parts += ["", environment_line(results)]
    atomic_write_text(Path(out) / "results.md", "\n".join(parts) + "\n")


def environment_line(results: dict) -> str:
    """The footer of every results.md: versions, threads, jobs, git revision, code hashes,
    total run time, the device when it is not the CPU in fp32 (so CPU footers read as they
    did before devices), and :func:`code_note`'s warning when the runs mix code."""
    env = results["environment"]
    total = sum(r["seconds"] for r in results["runs"])
    code = ", ".join(results.get("code") or {}) or "unknown"
    where = ""
    if env.get("device", "cpu") != "cpu" or env.get("precision", "fp32") != "fp32":
        where = f"{env.get('device_name')} ({env.get('device')}, {env.get('precision')}), "
    return (
        f"Environment: {where}python {env['python']}, torch {env['torch']}, {env['cpus']} CPUs, "
        f"{env.get('torch_threads_per_run')} thread(s) per run, {env.get('jobs')} job(s), git {env['git_rev']}, "
        f"code {code}; sum of run times {total:.0f} s."
    ) + (f"\n\n{note}" if (note := code_note(results)) else "")


def save_figure(fig: plt.Figure, path: Path, rect: tuple[float, float, float, float] | None = None) -> None:
    """Lay out (within ``rect`` of the figure, if given), write ``path`` via a temporary file
    and an atomic rename, close."""
    fig.tight_layout(rect=rect)
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def plot_curves(
    runs: list[dict],
    y: str,
    path: Path,
    x: str = "step",
    ylabel: str | None = None,
    title: str = "",
    logy: bool = False,
) -> None:
    """Panel per task; per method the mean over seeds of ``curves[y]`` vs ``curves[x]``
    with a min-max band (log y axis when ``logy``). Runs whose curves lack ``y`` are skipped."""
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        methods = list(dict.fromkeys(r["method"] for r in runs if r["task"] == task))
        for method in methods:
            curves = [r["curves"] for r in runs if r["task"] == task and r["method"] == method and r["curves"].get(y)]
            if not curves:
                continue
            n = min(len(c[y]) for c in curves)
            xs = np.asarray(curves[0][x][:n])
            ys = np.asarray([[np.nan if v is None else v for v in c[y][:n]] for c in curves], dtype=float)
            line = ax.plot(xs, np.nanmean(ys, 0), label=method)[0]
            if len(curves) > 1:
                ax.fill_between(xs, np.nanmin(ys, 0), np.nanmax(ys, 0), color=line.get_color(), alpha=0.15)
        ax.set_title(task)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel or y)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def plot_bars(
    runs: list[dict], metric: str, path: Path, ylabel: str | None = None, title: str = "", hline: float | None = None
) -> None:
    """Panel per task; one bar per method (mean over seeds) with every seed as a dot."""
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    fig, axes = plt.subplots(len(tasks), 1, figsize=(max(6, 0.45 * len(methods) + 2), 3.2 * len(tasks)), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks):
        for i, method in enumerate(methods):
            vals = [r["metrics"].get(metric) for r in runs if r["task"] == task and r["method"] == method]
            vals = [v for v in vals if v is not None]
            if not vals:
                continue
            ax.bar(i, np.mean(vals), color="C0", alpha=0.5)
            ax.scatter([i] * len(vals), vals, color="k", s=8, zorder=3)
        if hline is not None:
            ax.axhline(hline, color="r", lw=0.8, ls="--")
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=7)
        ax.set_title(task)
        ax.set_ylabel(ylabel or metric)
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
