"""Run every reproduction (and factor sweep) whose numbers README.md and docs/ quote, into
``results/NAME``, and record each invocation's wall and CPU time in ``results/NAME/wall.json``.

    python scripts/reproduce_all.py                       # all of them, in the order below
    python scripts/reproduce_all.py gotu evidence --jobs 2
    python scripts/reproduce_all.py longctx-peers --keep-old-runs   # a task added: the finished ones kept
    masklab report                                        # then regenerate the docs' tables

Every folder under ``results/`` has one entry in :data:`REPRODUCTIONS`: its name and the
steps that make it, in order (a router fitted, then measured on val and on test; a
``masklab realdocs`` val run, then test). A step is a masklab subcommand's arguments, or a
project script (``scripts/*.py``) with its arguments. A masklab step writes into
``results/NAME`` unless it names its own ``--out`` (inside ``results/NAME``: several runs in
one folder); a script names the file it writes. The entries marked ``explicit`` read the
frozen test split of the real-document benchmark, which is read once per shipped method:
they run only when named, never in the run of all.

A reproduction resumes: runs already in ``results/NAME`` that the same code made are kept
(:mod:`masklab.lab.revision`), so an interrupted call, or a call after an edit to one study,
redoes only what is missing or stale. Each step appends one entry to ``wall.json`` (wall
seconds, CPU seconds of the child processes, load average at the start, exit code), so the
time a table cost is the sum of its entries.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.cli import REAL_LM_COMMANDS  # noqa: E402
from masklab.util.files import read_json, write_json  # noqa: E402


class Reproduction(NamedTuple):
    """``results/NAME`` and the steps that make it, in order: each a masklab subcommand's
    arguments (without ``--jobs``/``--no-progress``, and without ``--out`` when it writes into
    ``results/NAME``) or ``["scripts/X.py", ...]``. ``explicit``: run only when named."""

    name: str
    steps: list[list[str]]
    explicit: bool = False


REPRODUCTIONS = [
    Reproduction("gotu", [["reproduce", "gotu"]]),
    Reproduction("evidence", [["reproduce", "evidence"]]),
    Reproduction("routing", [["reproduce", "routing"]]),
    Reproduction("vision", [["reproduce", "vision"]]),
    Reproduction("lm", [["reproduce", "lm"]]),
    Reproduction("arith", [["reproduce", "arith"]]),
    Reproduction("gotu-designs", [["sweep", "gotu-designs", "--seeds", "1"]]),
    Reproduction("routing-targets", [["sweep", "routing-targets"]]),
    Reproduction("pretrained", [["reproduce", "pretrained"]]),
    Reproduction("tune-prior", [["reproduce", "tune-prior"]]),
    Reproduction("longctx", [["reproduce", "longctx"]]),
    Reproduction("evidence-prior", [["reproduce", "evidence-prior"]]),
    # the question-aware peers at 1024 tokens, 30 examples per cell, with the shipped routers (docs/context.md)
    Reproduction(
        "longctx-peers",
        [
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "niah,multikey,multivalue,vt,stale",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "30",
                "--routers",
                "lexical,bm25,longllmlingua,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "snapkv,snapkv-question,finch",
            ],
        ],
    ),
    # the same on Gemma 3 270M (multivalue apart, below)
    Reproduction(
        "longctx-peers-gemma",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,multikey,vt,stale",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "30",
                "--routers",
                "lexical,bm25,longllmlingua,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "snapkv,snapkv-question,finch",
            ],
        ],
    ),
    # Gemma's multivalue at 1024 tokens: two seeds of 15 examples, so two cores share one task
    Reproduction(
        "longctx-peers-gemma-multivalue",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "multivalue",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "15",
                "--seeds",
                "2",
                "--routers",
                "lexical,bm25,longllmlingua,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "snapkv,snapkv-question,finch",
            ],
        ],
    ),
    # Gemma answering, SmolLM2's router ranking (--router-model), on the tasks where Gemma's full context scores >= 0.5
    Reproduction(
        "longctx-gemma-via-smollm2",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,multikey,stale",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "30",
                "--evidence",
                "0",
                "--routers",
                "evidence,bm25",
                "--router-source",
                "shipped",
                "--router-model",
                "smollm2-135m",
                "--compare",
                "none",
            ],
        ],
    ),
    # Gemma's shipped router since the hop feature (v4-hop) on the same 1024-token examples, against the full context
    Reproduction(
        "longctx-gemma-hop",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,multikey,vt,stale,multivalue",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "30",
                "--routers",
                "evidence",
                "--router-source",
                "shipped",
                "--compare",
                "none",
            ],
        ],
    ),
    # where pruning pays: 4096 tokens, the shipped routers and the word-overlap peers
    # (one entry per model: each fits a session)
    Reproduction(
        "longctx-4k",
        [
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "niah,stale",
                "--length",
                "4096",
                "--keep",
                "0.25",
                "--examples",
                "20",
                "--routers",
                "lexical,bm25,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "none",
            ],
        ],
    ),
    Reproduction(
        "longctx-4k-gemma",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,stale",
                "--length",
                "4096",
                "--keep",
                "0.25",
                "--examples",
                "20",
                "--routers",
                "lexical,bm25,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "none",
            ],
        ],
    ),
    # Gemma's shipped router since the hop feature at 4096 tokens, the same examples, against the full context
    Reproduction(
        "longctx-4k-gemma-hop",
        [
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,stale",
                "--length",
                "4096",
                "--keep",
                "0.25",
                "--examples",
                "20",
                "--routers",
                "evidence",
                "--router-source",
                "shipped",
                "--compare",
                "none",
            ],
        ],
    ),
    # the smaller runs the docs quote, each with the arguments its results.json records (--out, --jobs and
    # --no-progress apart, which masklab_args adds)
    Reproduction(
        "ep-arith-p20",
        [
            [
                "evidence-prior",
                "--task",
                "arith",
                "--probe-fraction",
                "0.2",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "1",
            ],
        ],
    ),
    Reproduction(
        "ep-arith-p30",
        [
            [
                "evidence-prior",
                "--task",
                "arith",
                "--probe-fraction",
                "0.3",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "1",
            ],
        ],
    ),
    Reproduction(
        "ep-arith-top4",
        [
            [
                "evidence-prior",
                "--task",
                "arith",
                "--top-k",
                "4",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "1",
            ],
        ],
    ),
    Reproduction(
        "ep-derive-drop",
        [["evidence-prior", "--derive-only", "--unidentifiable", "drop", "--task", "cyclic3,maj3,2parity"]],
    ),
    Reproduction(
        "ep-derive-probe",
        [
            [
                "evidence-prior",
                "--derive-only",
                "--source",
                "probe",
                "--steps",
                "600",
                "--task",
                "cyclic3,maj3,2parity",
            ],
        ],
    ),
    Reproduction(
        "ep-lm-top16",
        [
            [
                "evidence-prior",
                "--task",
                "lm",
                "--top-k",
                "16",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "1",
            ],
        ],
    ),
    Reproduction(
        "ep-maj3-drop",
        [
            [
                "evidence-prior",
                "--task",
                "maj3",
                "--unidentifiable",
                "drop",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "3",
            ],
        ],
    ),
    Reproduction(
        "ep-vision-top9",
        [
            [
                "evidence-prior",
                "--task",
                "vision",
                "--top-k",
                "9",
                "--method",
                "mask-derived,mask-shuffled",
                "--seeds",
                "1",
            ],
        ],
    ),
    Reproduction("ev-aggregate-seeds", [["evidence", "--task", "aggregate", "--seeds", "3"]]),
    Reproduction(
        "ev-h3-aux", [["evidence", "--task", "multihop", "--hops", "3", "--teacher-steps", "3000", "--aux", "1"]]
    ),
    Reproduction("ev-h3-seeds", [["evidence", "--task", "multihop", "--hops", "3", "--seeds", "3"]]),
    Reproduction("ev-quick", [["evidence", "--quick"]]),
    Reproduction("ev-stale-3k", [["evidence", "--task", "stale", "--teacher-steps", "3000", "--recency", "none"]]),
    Reproduction("ev-stale-3k-rec", [["evidence", "--task", "stale", "--teacher-steps", "3000", "--recency", "stale"]]),
    Reproduction("ev-stale-6k", [["evidence", "--task", "stale", "--teacher-steps", "6000", "--recency", "none"]]),
    Reproduction("ev-stale-seeds", [["evidence", "--task", "stale", "--seeds", "3"]]),
    Reproduction("ev-untrained", [["evidence", "--task", "multihop", "--quick", "--items", "16"]]),
    Reproduction("lm-nopos", [["lm", "--method", "mask-nopos", "--seeds", "3"]]),
    Reproduction("longctx-quick", [["longctx", "--quick"]]),
    Reproduction(
        "routing-d2h2",
        [
            [
                "routing",
                "--task",
                "multihop",
                "--hops",
                "2,3",
                "--targets",
                "gold",
                "--independent",
                "none",
                "--baselines",
                "none",
                "--router-depth",
                "2",
                "--router-heads",
                "2",
                "--seeds",
                "3",
            ],
        ],
    ),
    Reproduction(
        "routing-d2h4",
        [
            [
                "routing",
                "--task",
                "multihop",
                "--hops",
                "2,3",
                "--targets",
                "gold",
                "--independent",
                "none",
                "--baselines",
                "none",
                "--router-depth",
                "2",
                "--router-heads",
                "4",
                "--seeds",
                "3",
            ],
        ],
    ),
    Reproduction(
        "routing-nols",
        [
            [
                "routing",
                "--task",
                "multihop",
                "--hops",
                "2",
                "--targets",
                "gold,causal",
                "--independent",
                "none",
                "--baselines",
                "dense",
                "--no-length-scale",
                "--seeds",
                "3",
            ],
        ],
    ),
    Reproduction(
        "tune-prior-lora-lr01",
        [
            [
                "tune-prior",
                "--method",
                "lora",
                "--lora-lr",
                "0.01",
                "--train-prompts",
                "200",
                "--test-prompts",
                "50",
                "--steps",
                "100",
                "--ppl-tokens",
                "256",
            ],
        ],
    ),
    # the commands of the runs of older revisions kept in docs/archive/longctx-earlier
    # (docs/longctx.md, "Earlier runs"), one folder per run, and the lexical router's gold recall, run with today's code
    Reproduction(
        "longctx-earlier",
        [
            [
                "scripts/longctx_lexical_recall.py",
                "--model",
                "smollm2-135m",
                "--examples",
                "20",
                "--json",
                "results/longctx-earlier/lexical_recall.json",
            ],
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "multikey,vt,count",
                "--hops",
                "1",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "3",
                "--out",
                "results/longctx-earlier/longctx-gemma512-more",
            ],
            [
                "longctx",
                "--model",
                "gemma3-270m",
                "--tasks",
                "niah,stale",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "3",
                "--out",
                "results/longctx-earlier/longctx-gemma512",
            ],
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "multikey",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "5",
                "--out",
                "results/longctx-earlier/longctx-smol1024-mk",
            ],
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "stale",
                "--length",
                "1024",
                "--keep",
                "0.25",
                "--examples",
                "5",
                "--evidence",
                "0",
                "--out",
                "results/longctx-earlier/longctx-smol1024-stale",
            ],
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "vt",
                "--hops",
                "1",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "8",
                "--evidence",
                "1",
                "--out",
                "results/longctx-earlier/longctx-smol512-vt1",
            ],
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "8",
                "--evidence",
                "1",
                "--out",
                "results/longctx-earlier/longctx-smol512",
            ],
        ],
    ),
    # the trained routers stopping at their decision boundary, then filling the kept fraction (--router-fill)
    Reproduction(
        "longctx-fill",
        [
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "niah,stale",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "8",
                "--train-examples",
                "5",
                "--compare",
                "none",
                "--routers",
                "evidence,attention",
                "--out",
                "results/longctx-fill/boundary",
            ],
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "niah,stale",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "8",
                "--train-examples",
                "5",
                "--compare",
                "none",
                "--routers",
                "evidence,attention",
                "--router-fill",
                "--out",
                "results/longctx-fill/fill",
            ],
        ],
    ),
    # units of `segment` on the real documents, with the segment of git f6c0646 and with this checkout's
    Reproduction(
        "segment-counts",
        [["scripts/segment_counts.py", "--before", "f6c0646", "--json", "results/segment-counts/results.json"]],
    ),
    # the trained routers (docs/context.md), hours per model: labels and fit, then held-out evals (an eval step fits
    # the router first where the folder has none, and refits it only when the labels changed)
    Reproduction(
        "router-gemma3-270m",
        [
            ["train-router", "--model", "gemma3-270m", "--examples", "130", "--length", "256"],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey,update",
                "--eval-lengths",
                "1024",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-gemma3-270m-1layer",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--eval",
                "--eval-split",
                "test",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey,update",
                "--eval-lengths",
                "1024",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    # its router was fitted in results/router-gemma3-270m-1layer (the same fit arguments) and copied here;
    # run by name, it is fitted here
    Reproduction(
        "router-gemma3-270m-1layer-2048",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey",
                "--eval-lengths",
                "2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-gemma3-270m-1layer-v4",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--features",
                "v4-hop",
                "--eval",
                "--eval-split",
                "val",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--features",
                "v4-hop",
                "--eval",
                "--eval-split",
                "test",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--features",
                "v4-hop",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey,update,chain",
                "--eval-lengths",
                "1024",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-gemma3-270m-1layer-v4-2048",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--layers",
                "1",
                "--features",
                "v4-hop",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey",
                "--eval-lengths",
                "2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    # its router was fitted in results/router-gemma3-270m (the same fit arguments) and copied here;
    # run by name, it is fitted here
    Reproduction(
        "router-gemma3-270m-2048",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey",
                "--eval-lengths",
                "2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    # -3kinds and -v2 were fitted when the train families had 3 kinds (no chain; data.per_kind in the router file):
    # today's have 4, so a rerun fits on chains too
    Reproduction(
        "router-gemma3-270m-3kinds",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "44",
                "--length",
                "256",
                "--features",
                "v3-relative",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "44",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-gemma3-270m-v2",
        [
            [
                "train-router",
                "--model",
                "gemma3-270m",
                "--examples",
                "44",
                "--length",
                "256",
                "--features",
                "v2-superseded",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-smollm2-135m",
        [
            ["train-router", "--model", "smollm2-135m", "--examples", "130", "--length", "256"],
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "val",
            ],
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey,update",
                "--eval-lengths",
                "1024",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    # its router was fitted in results/router-smollm2-135m (the same fit arguments) and copied here;
    # run by name, it is fitted here
    Reproduction(
        "router-smollm2-135m-2048",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multikey",
                "--eval-lengths",
                "2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-smollm2-135m-3kinds",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "44",
                "--length",
                "256",
                "--features",
                "v3-relative",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "44",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-smollm2-135m-chain60",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-kinds",
                "chain",
                "--eval-lengths",
                "2048",
                "--eval-examples",
                "60",
            ],
        ],
    ),
    # its router was fitted in results/router-smollm2-135m (the same fit arguments) and copied here;
    # run by name, it is fitted here
    Reproduction(
        "router-smollm2-135m-multi",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--eval",
                "--eval-split",
                "test",
                "--eval-answers",
                "--eval-kinds",
                "multi",
                "--eval-lengths",
                "1024",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-smollm2-135m-v2",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "44",
                "--length",
                "256",
                "--features",
                "v2-superseded",
                "--eval",
                "--eval-split",
                "val",
                "--eval-lengths",
                "1024,2048",
                "--eval-examples",
                "30",
            ],
        ],
    ),
    Reproduction(
        "router-smollm2-135m-v4",
        [
            [
                "train-router",
                "--model",
                "smollm2-135m",
                "--examples",
                "130",
                "--length",
                "256",
                "--features",
                "v4-hop",
                "--eval",
                "--eval-split",
                "val",
            ],
        ],
    ),
    # the real-document benchmark (val chooses, test reports). explicit: the frozen test split is read once per shipped
    # method (each read is logged in reads.jsonl), so these run only when named
    Reproduction(
        "realdocs-gemma3-270m",
        [
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                "val",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                "test2",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                "test",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-anchors-gemma3-270m",
        [
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                split,
                "--routers",
                "bm25,dense,langchain-embeddingsfilter,llamaindex-sentenceoptimizer",
                "--keep",
                "0.1,0.25",
            ]
            for split in ("test2", "test")
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-gemma3-270m-answers",
        [
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                "test",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence",
                "--keep",
                "0.1,0.25",
                "--questions",
                "16",
                "--answers",
                "--max-new-tokens",
                "16",
            ],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-gemma3-270m-via-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--router-model",
                "smollm2-135m",
                "--split",
                "test",
                "--routers",
                "bm25,evidence,bm25+evidence",
                "--keep",
                "0.1,0.25",
            ],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "val",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "test2",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "test",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence,bm25+attention,dense,bm25+dense",
                "--keep",
                "0.1,0.25",
            ],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-anchors-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                split,
                "--routers",
                "bm25,dense,langchain-embeddingsfilter,llamaindex-sentenceoptimizer",
                "--keep",
                "0.1,0.25",
            ]
            for split in ("test2", "test")
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-smollm2-135m-answers",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "test",
                "--routers",
                "bm25,lexical,evidence,attention,bm25+evidence",
                "--keep",
                "0.1,0.25",
                "--questions",
                "16",
                "--answers",
                "--max-new-tokens",
                "16",
            ],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-smollm2-135m-via-gemma3-270m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--router-model",
                "gemma3-270m",
                "--split",
                "test",
                "--routers",
                "bm25,evidence,bm25+evidence",
                "--keep",
                "0.1,0.25",
            ],
        ],
        explicit=True,
    ),
    # how bm25+evidence and bm25+dense fuse, chosen from the committed val scores of realdocs-MODEL (no model runs)
    Reproduction("realdocs-fusion", [["scripts/choose_fusion.py"]]),
    # the pruner: causal and attention labels of the training corpus (resumable, CPU-hours), then its training
    Reproduction(
        "corpus-labels",
        [
            ["scripts/label_corpus.py", "--shards", "2"],
            ["scripts/label_corpus.py", "--split", "val"],
            ["scripts/label_agreement.py"],
            ["scripts/label_agreement.py", "--split", "val"],
            ["scripts/label_corpus.py", "--model", "gemma3-270m", "--split", "val"],
            ["scripts/label_agreement.py", "--model", "gemma3-270m", "--split", "val"],
            ["scripts/label_corpus.py", "--model", "gemma3-270m", "--split", "train"],
            ["scripts/label_agreement.py", "--model", "gemma3-270m"],
        ],
    ),
    Reproduction(
        "pruner",
        [
            ["scripts/train_pruner.py", "--designs", "head,lora", "--thresholds", "0.5,1,2", "--ship"],
            [
                "scripts/keep_auto.py",
                "results/realdocs-pruner-smollm2-135m/results_test2.json",
                "results/realdocs-pruner-gemma3-270m/results_test2.json",
            ],
        ],
    ),
    Reproduction(
        "realdocs-pruner-gemma3-270m",
        [
            [
                "realdocs",
                "--model",
                "gemma3-270m",
                "--split",
                split,
                "--routers",
                "bm25,dense,bm25+dense,bm25+evidence,pruner,pruner-attention,pruner-marks",
                "--keep",
                "0.1,0.25",
            ]
            for split in ("test2", "test")
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-pruner-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                split,
                "--routers",
                "bm25,dense,bm25+dense,bm25+evidence,pruner,pruner-attention,pruner-marks",
                "--keep",
                "0.1,0.25",
            ]
            for split in ("test2", "test")
        ],
        explicit=True,
    ),
    # the context pruner: keep-set labels of the corpus (resumable, about 9 s a question), their agreement with the
    # marks, the token-level cross-encoder (lasso labels; CPU-hours to train), the context head's variants on val
    Reproduction(
        "cross",
        [
            ["scripts/train_cross.py", "--labels", "lasso"],
            ["scripts/train_cross.py", "--labels", "marks"],  # the cross once shipped: --ship marks
            # the labels compared on the same questions, and their union on every question
            ["scripts/train_cross.py", "--labels", "marks,keepset,attention", "--common", "--hops", "1"],
            ["scripts/train_cross.py", "--labels", "union", "--epochs", "1", "--hops", "1"],
            # issue 66's verdict: the file with both faults fixed against pruner-ctx on val (results/cross/val.json)
            ["scripts/train_cross.py", "--labels", "marks", "--ship", "marks"],
            ["scripts/cross_val.py"],
        ],
    ),
    Reproduction(
        "realdocs-cross-labels-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "test3",
                "--routers",
                "cross-marks-common,cross-keepset-common,cross-attention-common",
            ],
            ["scripts/label_comparison.py"],
        ],
        explicit=True,
    ),
    Reproduction(
        "ctx",
        [
            ["scripts/label_corpus.py", "--labels", "keepset", "--split", "val"],
            ["scripts/label_corpus.py", "--labels", "keepset", "--split", "train"],
            ["scripts/keepset_agreement.py", "--split", "val"],
            ["scripts/keepset_agreement.py", "--split", "train"],
            ["scripts/train_ctx.py", "--threads", "2", "--ship", "union,attention"],
        ],
    ),
    Reproduction(
        "realdocs-ctx-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                split,
                "--routers",
                "bm25,dense,bm25+dense,pruner,pruner-ctx,pruner-ctx-attention",
                "--threads",
                "2",
            ]
            for split in ("test2", "test")
        ]
        + [
            [
                "scripts/keep_auto.py",
                "--out",
                "results/realdocs-ctx-smollm2-135m/keep_auto.json",
                "results/realdocs-ctx-smollm2-135m/results_test2.json",
            ]
        ],
        explicit=True,
    ),
    # the cross pruner and the second hop on the corpus's val (all kinds, then the bridge questions), test3 read once,
    # and the keep probabilities' calibration from the stored scores; history: cross and cross-hop1 were read when
    # cross was a product router with packaged weights (before issue 66); the lab's cross needs its file (path=)
    Reproduction(
        "realdocs-cross-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "corpus-val",
                "--questions",
                "320",
                "--routers",
                "bm25,dense,bm25+dense,pruner-ctx,pruner-ctx+hop2,dense+hop2,cross,cross-hop1",
            ],
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "test3",
                "--routers",
                "bm25,dense,bm25+dense,pruner-ctx,cross",
            ],
            ["realdocs", "--model", "smollm2-135m", "--split", "test2", "--routers", "cross"],
        ],
        explicit=True,
    ),
    Reproduction(
        "realdocs-cross-bridge-smollm2-135m",
        [
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "corpus-val",
                "--kinds",
                "bridge",
                "--routers",
                "bm25,dense,bm25+dense,pruner-ctx,pruner-ctx+hop2,dense+hop2,cross,cross-hop1",
            ],
        ],
    ),
    Reproduction(
        "calibration",
        [
            [
                "scripts/calibration.py",
                "--val",
                "results/realdocs-cross-smollm2-135m/results_corpus-val.json",
                "--test",
                "results/realdocs-cross-smollm2-135m/results_test3.json",
                "--routers",
                "pruner-ctx,cross",
            ]
        ],
    ),
    Reproduction("keep-rules", [["scripts/keep_rules.py"]]),  # from the stored scores of val, test2 and test3
    Reproduction(
        "cascade", [["scripts/cascade_recall.py", "--threads", "2"]]
    ),  # the cross router's first stage on long documents
    # the shipped routers and pruners on the generated held-out families and the long-context tasks
    Reproduction("heldout-routers-smollm2-135m", [["scripts/heldout_routers.py"]]),
    Reproduction(
        "longctx-routers-smollm2-135m", [["scripts/heldout_routers.py", "--tasks", "longctx", "--lengths", "1024"]]
    ),
    Reproduction(
        "longctx-quick-pruner",
        [
            [
                "longctx",
                "--model",
                "smollm2-135m",
                "--tasks",
                "niah,stale",
                "--length",
                "512",
                "--keep",
                "0.25",
                "--examples",
                "30",
                "--routers",
                "bm25,dense,pruner,evidence",
                "--router-source",
                "shipped",
                "--compare",
                "none",
            ],
        ],
    ),
    # the passage level (issue 66): every variant on the causal labels and on the marks of the same questions, the
    # marks' one-hop head shipped (the val MRR winner), each test split read once with it beside pruner-ctx
    Reproduction(
        "passage",
        [
            ["scripts/train_passage.py", "--out", "results/passage"],
        ],
    ),
    Reproduction(
        "passage-marks",
        [
            # the shipped head is this run's passage-one-hop (--ship one-hop writes it into the package)
            ["scripts/train_passage.py", "--labels", "marks", "--out", "results/passage-marks"],
        ],
    ),
    Reproduction(
        "realdocs-passage-smollm2-135m",
        [
            [
                "realdocs",
                "--split",
                split,
                "--routers",
                "bm25,dense,bm25+dense,pruner-ctx,pruner-passage",
                "--threads",
                "2",
            ]
            for split in ("test3", "test2", "test")
        ],
        explicit=True,
    ),
    # about 6.5 CPU-hours (benchmarks/arith_size_cost.json), 84% of it at x4: last
    Reproduction("arith-size", [["sweep", "arith-size"]]),
]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def masklab_args(name: str, step: list[str], jobs: int, keep_old_runs: bool = False) -> list[str]:
    """The arguments ``masklab`` runs a step with: ``--out results/NAME`` unless the step names
    its own, ``--no-progress``, and ``--jobs`` and ``--keep-old-runs`` where the subcommand takes
    them (the studies, ``reproduce`` and ``sweep``; not the real-LM commands such as
    ``train-router`` and ``realdocs``)."""
    args = [*step] if "--out" in step else [*step, "--out", f"results/{name}"]
    if step[0] in REAL_LM_COMMANDS:
        return [*args, "--no-progress"]
    return [*args, "--jobs", str(jobs), "--no-progress", *(["--keep-old-runs"] if keep_old_runs else [])]


def run_step(name: str, step: list[str], jobs: int, keep_old_runs: bool) -> int:
    """Run one step from the repository root and append its times to ``results/NAME/wall.json``."""
    out = ROOT / "results" / name
    if step[0].startswith("scripts/"):
        cmd, shown = [sys.executable, *step], "python " + " ".join(step)
    else:
        args = masklab_args(name, step, jobs, keep_old_runs)
        cmd, shown = [sys.executable, "-m", "masklab", *args], "masklab " + " ".join(args)
    print(f"== {name}: {shown}", flush=True)
    load, started = os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%S%z")
    start, cpu0 = time.perf_counter(), cpu_seconds()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the scripts import masklab
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "PYTHONPATH": path}
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    entry = {
        "command": shown,
        "started": started,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(cpu_seconds() - cpu0, 1),
        "load_at_start": round(load, 2),
        "cpus": os.cpu_count(),
        "rc": rc,
    }
    log_path = out / "wall.json"
    log = read_json(log_path) if log_path.exists() else {"invocations": []}
    log["invocations"].append(entry)
    log["wall_s_total"] = round(sum(e["wall_s"] for e in log["invocations"]), 1)
    log["cpu_s_total"] = round(sum(e["cpu_s"] for e in log["invocations"]), 1)
    out.mkdir(parents=True, exist_ok=True)
    write_json(log_path, log)
    print(f"== {name}: rc {rc}, {entry['wall_s']:.0f} s wall, {entry['cpu_s']:.0f} s CPU", flush=True)
    return rc


def run(r: Reproduction, jobs: int, keep_old_runs: bool = False) -> int:
    """Run ``r``'s steps in order; stop at the first that fails (a later one reads what it
    makes) and return its exit code, else 0."""
    for step in r.steps:
        if rc := run_step(r.name, step, jobs, keep_old_runs):
            return rc
    return 0


def main() -> int:
    names = [r.name for r in REPRODUCTIONS]
    explicit = [r.name for r in REPRODUCTIONS if r.explicit]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"which to run (default all but the explicit ones: {', '.join(n for n in names if n not in explicit)}). "
        f"Explicit, run only when named: {', '.join(explicit)} (they read the frozen test split of the "
        "real-document benchmark, which is read once per shipped method)",
    )
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel per masklab study step (default 2)")
    ap.add_argument(
        "--keep-old-runs",
        action="store_true",
        help="keep finished runs that other code made (masklab's --keep-old-runs: the tables then say they mix code)",
    )
    a = ap.parse_args()
    if unknown := set(a.names) - set(names):
        ap.error(f"unknown: {', '.join(sorted(unknown))} (choose from {', '.join(names)})")
    chosen = [r for r in REPRODUCTIONS if r.name in a.names or (not a.names and not r.explicit)]
    failed = [r.name for r in chosen if run(r, a.jobs, a.keep_old_runs) != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
