"""masklab.lab.pipeline: the one evaluation loop (interleaving, resume, router share) and its measures."""

import json

from masklab.lab import pipeline
from masklab.context.router import Pruned
from masklab.text.document import Document


def test_gold_kept_is_the_share_and_gold_top_the_exact_top():
    doc = Document(units=["alpha", "beta", "gamma", "delta"], gold=[1, 3])
    pruned = Pruned(doc, kept=[0, 1], scores=[0.9, 0.8, 0.1, 0.2], lengths=[1, 1, 1, 1], seconds=0.0, router="x")
    assert pipeline.gold_kept(doc, pruned) == 0.5
    assert pipeline.gold_top(doc, pruned) == 0.0  # its best two are 0 and 1, not 1 and 3
    best = Pruned(doc, kept=[1, 3], scores=[0.1, 0.8, 0.2, 0.9], lengths=[1, 1, 1, 1], seconds=0.0, router="x")
    assert pipeline.gold_kept(doc, best) == 1.0 and pipeline.gold_top(doc, best) == 1.0
    rewritten = Pruned(doc, kept=[], scores=[], lengths=[1, 1, 1, 1], seconds=0.0, router="x", compressed="beta gamma")
    assert pipeline.gold_kept(doc, rewritten) == 0.5  # rewritten text: gold units found verbatim


def test_methods_are_interleaved_rows_logged_and_a_killed_run_resumes(tmp_path):
    order, log = [], tmp_path / "rows.jsonl"

    def step(name, prefill=None):
        def run(ex):
            order.append((ex, name))
            row = (
                {"acc": float(ex % 2 == 0), "router_s": 0.5} if prefill is None else {"acc": 1.0, "prefill_s": prefill}
            )
            return row, f"{name} on {ex}"

        return run

    def methods(i, ex):
        return [("full", step("full", prefill=2.0)), ("a", step("a")), ("b", step("b"))]

    records = pipeline.evaluate([10, 11, 12], methods, log)
    assert [n for _, n in order] == ["full", "a", "b", "a", "b", "full", "b", "full", "a"]  # rotated by the index
    assert [r["key"] for r in records] == [0, 1, 2] and records[1]["answers"]["a"] == "a on 11"
    assert records[0]["rows"]["a"]["router_share"] == 0.25  # its seconds over the same example's full prefill
    assert pipeline.means(records)["acc|a"] == 2 / 3
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # killed while writing the third example
    order.clear()
    again = pipeline.evaluate([10, 11, 12], methods, log)
    assert {ex for ex, _ in order} == {12} and again[:2] == records[:2]
    assert [json.loads(line)["key"] for line in log.read_text().splitlines()[-1:]] == [2]
