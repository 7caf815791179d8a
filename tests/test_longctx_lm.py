"""Long-context tasks on a real LM: the oracle router (gold sentences kept, the rest deleted
before prefill) answers like the full context; evidence sets by group testing find the needle.
The model tests are slow (CI runs them) and skip when SmolLM2's package is missing."""

import pytest
import torch

from conftest import needs_hf, save_tiny_folder
from masklab.context.routers.lexical import Lexical
from masklab.lab.routers.oracle import OracleGold
from masklab.text.selection import select
from masklab.lab.tasks.longctx import make_example
from masklab.lab.routers.registry import prune_one


def test_oracle_keep_holds_gold_within_budget():
    ex = make_example("vt", 512, 0)
    lengths = [len(s.split()) + 1 for s in ex.sentences]
    oracle = OracleGold(seed=1)
    scores = oracle.score(ex, ex.question)
    for keep in (0.1, 0.25, 0.5):
        k = select(scores, lengths, keep)
        assert all(g in k for g in ex.gold)
        kept = sum(lengths[i] for i in k)
        assert kept <= max(keep * sum(lengths), sum(lengths[g] for g in ex.gold))
        assert kept >= keep * sum(lengths) - max(lengths)  # filled up to the budget
    assert torch.equal(scores, OracleGold(seed=1).score(ex, ex.question))
    assert not torch.equal(scores, OracleGold(seed=2).score(ex, ex.question))  # the seed decides the fill


def test_chunks_cover_the_sentences_in_order():
    from masklab.lab.linear_routers import chunk_units as chunk_sentences

    lengths = [5, 9, 3, 20, 4, 4, 4]
    chunks = chunk_sentences(lengths, 12)
    assert [i for c in chunks for i in c] == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in c) <= 12 or len(c) == 1 for c in chunks)
    assert chunks == [[0], [1, 2], [3], [4, 5, 6]]
    assert chunk_sentences(lengths, None) == [[i] for i in range(len(lengths))]


def test_lexical_router_ranks_the_asked_needle_first():
    for seed in range(6):
        ex = make_example("multikey", 512, seed, distractors=3)
        lengths = [len(s.split()) + 1 for s in ex.sentences]
        g = ex.gold[0]
        scores = Lexical().score(ex, ex.question)
        keep = select(scores, lengths, (lengths[g] + 1) / sum(lengths))  # room for about one sentence
        assert g in keep and len(keep) <= 2
        assert select(scores, [1] * len(lengths), 1 / len(lengths)) == [g]  # one sentence fits


@pytest.mark.slow
def test_oracle_router_answers_like_full_context(smol):
    from masklab.context.answer import generate_answer
    from masklab.lab.tasks.longctx import score

    ex = make_example("niah", 256, 0, smol.tokenizer)
    full = generate_answer(smol, ex.units, ex.query)
    assert score(full["generated"], ex), full["generated"]
    kept = prune_one(OracleGold(smol), ex, ex.question, 0.25).kept
    oracle = generate_answer(smol, [ex.units[i] for i in kept], ex.query)
    assert score(oracle["generated"], ex) and oracle["tokens"] < 0.5 * full["tokens"]
    # a router that drops the gold sentence (and keeps everything else) cannot answer
    no_gold = [u for i, u in enumerate(ex.units) if i not in ex.gold]
    assert not score(generate_answer(smol, no_gold, ex.query)["generated"], ex)


@pytest.mark.slow
def test_group_testing_evidence_finds_the_needle(smol):
    from masklab.lab.linear_routers import make_labels
    from masklab.lab.tasks.longctx import score

    ex = make_example("niah", 256, 0, smol.tokenizer)
    lab = make_labels(smol, ex, ex.query, accept=lambda text: score(text, ex))
    assert lab["correct"] and lab["evidence"] == ex.gold
    n = len(ex.sentences)
    assert lab["passes"] < n  # cheaper than leave-one-out
    chunked = make_labels(smol, ex, ex.query, accept=lambda text: score(text, ex), chunk_tokens=48)
    assert set(ex.gold) <= set(chunked["evidence"]) and len(chunked["evidence"]) < 0.5 * n
    assert chunked["passes"] < lab["passes"]  # fewer items to search
    wrong = make_labels(smol, ex, ex.query, accept=lambda text: False)  # a rejected answer: no labels, one pass
    assert wrong["evidence"] is None and wrong["passes"] == 1


def test_study_rejects_bad_input(tmp_path):
    from masklab.util.errors import MasklabError
    from masklab.lab.studies.longctx import Config, run

    with pytest.raises(MasklabError, match="--keep"):
        run(Config(keeps=[0.25, 1.5]), tmp_path)
    with pytest.raises(MasklabError, match="--threads must be >= 1"):
        run(Config(threads=0), tmp_path)
    with pytest.raises(MasklabError, match="unknown long-context task"):
        run(Config(tasks=["nope"]), tmp_path)
    with pytest.raises(MasklabError, match="--length"):
        run(Config(lengths=[100]), tmp_path)
    with pytest.raises(MasklabError, match="unknown router"):
        run(Config(routers=["evidence", "nope"]), tmp_path)
    with pytest.raises(MasklabError, match="unknown press"):
        run(Config(compare=["snapkv", "h2o"]), tmp_path)
    with pytest.raises(MasklabError, match="--router-model ranks with a shipped router"):
        run(Config(router_model="smollm2-135m"), tmp_path)  # routers trained here
    with pytest.raises(MasklabError, match="unknown model"):
        run(Config(router_model="nope", router_source="shipped"), tmp_path)


def test_a_run_is_named_by_the_routers_it_uses(monkeypatch, tmp_path):
    """Shipped routers: a run's settings hold their weights' digest (new weights redo the run)
    and not the task set (``--tasks multikey`` alone resumes a two-task run's multikey);
    routers trained here: the task set they are trained on, and no digest."""
    from masklab.context.routers import trained
    from masklab.lab.studies.longctx import Config, specs_for

    (tmp_path / "smollm2-135m.safetensors").write_bytes(b"weights one")
    monkeypatch.setattr(trained, "WEIGHTS", tmp_path)
    shipped = Config(tasks=["multikey", "stale"], routers=["lexical", "evidence"], router_source="shipped")
    both = {s.task: s.params for s in specs_for(shipped)}
    alone = {s.task: s.params for s in specs_for(Config(**{**shipped.__dict__, "tasks": ["multikey"]}))}
    assert alone["multikey@512"] == both["multikey@512"] and "task_set" not in both["multikey@512"]
    (tmp_path / "smollm2-135m.safetensors").write_bytes(b"weights two")
    again = {s.task: s.params for s in specs_for(shipped)}
    assert again["multikey@512"]["shipped_router"] != both["multikey@512"]["shipped_router"]
    here = {s.task: s.params for s in specs_for(Config(**{**shipped.__dict__, "router_source": "train"}))}
    assert here["stale@512"]["task_set"] == ["multikey", "stale"] and "shipped_router" not in here["stale@512"]
    words = {s.task: s.params for s in specs_for(Config(**{**shipped.__dict__, "routers": ["lexical"]}))}
    assert not {"task_set", "shipped_router"} & set(words["stale@512"])
    # --router-model: the ranking model's weights name the run; without it the settings are as before it existed
    (tmp_path / "gemma3-270m.safetensors").write_bytes(b"gemma weights")
    gemma = Config(**{**shipped.__dict__, "models": ["gemma3-270m"]})
    own = {s.task: s.params for s in specs_for(gemma)}["stale@512"]
    ranked = {s.task: s.params for s in specs_for(Config(**{**gemma.__dict__, "router_model": "smollm2-135m"}))}[
        "stale@512"
    ]
    assert "router_model" not in own and ranked["router_model"] == "smollm2-135m"
    assert own["shipped_router"] != ranked["shipped_router"] == again["stale@512"]["shipped_router"]
    folder = {s.task: s.params for s in specs_for(Config(**{**shipped.__dict__, "models": [str(tmp_path)]}))}
    assert (
        folder["stale@512"]["shipped_router"] == again["stale@512"]["shipped_router"]
    )  # no router of its own: SmolLM2's


@pytest.mark.slow
def test_study_rows(smol, shared_loads, tmp_path):
    import json

    from masklab.lab.studies.longctx import Config, run

    run(
        Config(
            tasks=["niah"],
            lengths=[256],
            keeps=[0.25],
            examples=1,
            train_examples=1,
            compare=["streaming"],
            routers=["lexical", "evidence", "attention", "dense"],
        ),
        tmp_path,
        progress=False,
    )
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["task"], r["method"]): r for r in res["summary"]}
    methods = [
        "full",
        "oracle-gold@0.25",
        "lexical@0.25",
        "evidence-router@0.25",
        "attention-router@0.25",
        "dense@0.25",
        "streaming@0.25",
    ]
    assert set(rows) == {("niah@256", m) for m in methods}
    assert rows[("niah@256", "lexical@0.25")]["gold_kept_mean"] == 1.0
    for m in methods:
        r = rows[("niah@256", m)]
        assert r["n"] == 1 and r["seconds_mean"] > 0 and r["peak_mb_mean"] > 0 and r["kv_mb_mean"] > 0
        # StreamingLLM keeps the first and last tokens (the needle is between); the attention
        # router trained on one example's top-attended sentence need not find the needle
        if m not in ("streaming@0.25", "attention-router@0.25"):
            assert r["acc_mean"] == 1.0, m
    for m in methods[1:]:
        assert (
            rows[("niah@256", m)]["kept_mean"] <= 0.25 + 1e-9
            and rows[("niah@256", m)]["kv_mb_mean"] < rows[("niah@256", "full")]["kv_mb_mean"]
        )
    for m in ("evidence-router@0.25", "attention-router@0.25"):
        r = rows[("niah@256", m)]
        assert 0 < r["router_share_mean"] < 1 and r["train_passes_mean"] > 1 and r["train_labelled_mean"] == 1
    assert rows[("niah@256", "evidence-router@0.25")]["gold_kept_mean"] == 1.0
    stored = list((tmp_path / "ckpt" / "routers").glob("*.safetensors"))
    assert len(stored) == 1 and stored[0].with_suffix(".json").exists()
    assert (tmp_path / "results.md").exists()


@needs_hf
def test_a_killed_run_resumes_after_its_last_example_with_the_same_answers(tmp_path):
    """Each finished example is appended to the run's ``examples.jsonl``; a run killed after
    its first example (simulated: the second line and the run record removed) answers only
    the second again and ends with the same per-example outcomes, intervals included. The
    bookkeeping, not the model, is tested: a tiny random model answers (512 characters)."""
    import json

    from masklab.lab.studies.longctx import Config, run

    model = save_tiny_folder(tmp_path / "tiny", "llama", max_positions=1024)
    cfg = Config(
        models=[str(model)],
        tasks=["niah"],
        lengths=[512],
        keeps=[0.25],
        examples=2,
        routers=["lexical", "bm25"],
        router_source="shipped",
        compare=[],
    )
    first = run(cfg, tmp_path, progress=False)
    ckpt = next((tmp_path / "ckpt").glob("*/examples-*.jsonl"))
    lines = ckpt.read_text().splitlines()
    assert len(lines) == 2
    ckpt.write_text(lines[0] + "\n")  # killed after the first example
    for record in (tmp_path / "runs").glob("*.json"):
        record.unlink()
    again = run(cfg, tmp_path, progress=False)
    assert ckpt.read_text().splitlines()[0] == lines[0] and len(ckpt.read_text().splitlines()) == 2

    def outcomes(res):  # every measure of every example but its timings (the router's share of the time too)
        timed = ("seconds", "router_share")
        return [
            {m: {k: v for k, v in row.items() if k not in timed and not k.endswith("_s")} for m, row in ex.items()}
            for ex in res["runs"][0]["extra"]["examples"]
        ]

    assert outcomes(again) == outcomes(first) and outcomes(first)[0] != outcomes(first)[1]
    rows = {r["method"]: r for r in again["summary"]}
    assert rows["lexical@0.25"]["acc_lo"] <= rows["lexical@0.25"]["acc_mean"] <= rows["lexical@0.25"]["acc_hi"]
    assert json.loads(lines[0])["rows"]["full"]["acc"] in (0.0, 1.0)
    # other settings (another kept fraction) do not reuse these examples
    other = run(Config(**{**cfg.__dict__, "keeps": [0.5]}), tmp_path, progress=False)
    assert {r["method"] for r in other["summary"]} >= {"lexical@0.5", "bm25@0.5"}
    assert len(list(ckpt.parent.glob("examples-*.jsonl"))) == 2  # its own file, not the keep-0.25 examples
