"""The `# example: ...` code blocks of docs/design.md run as written and do what the text says.

Each block is extracted from the document and executed; every registry entry it adds is
removed again afterwards, so other tests see the registries unchanged.
"""

import argparse
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from masklab.util import flags
from masklab.util.errors import MasklabError

DOC = Path(__file__).parent.parent / "docs" / "design.md"


def example(name: str) -> str:
    blocks = re.findall(r"```python\n# example: ([\w-]+)\n(.*?)```", DOC.read_text(), flags=re.S)
    found = {n: code for n, code in blocks}
    assert name in found, f"docs/design.md has no '# example: {name}' block"
    return found[name]


def run_example(name: str, module: str = "masklab.design_example") -> types.ModuleType:
    mod = types.ModuleType(module)
    sys.modules[module] = mod
    exec(compile(example(name), f"docs/design.md:{name}", "exec"), mod.__dict__)
    return mod


def test_every_example_is_tested():
    names = re.findall(r"^# example: ([\w-]+)$", DOC.read_text(), flags=re.M)
    assert sorted(names) == sorted(
        [
            "study",
            "design",
            "qk-init",
            "search",
            "router",
            "selector",
            "architecture",
            "context-router",
            "context-deciding-router",
        ]
    )


def test_study_example_runs_resumes_and_takes_its_flags(tmp_path):
    toy = run_example("study", "masklab.lab.studies.toy")
    try:
        res = toy.run(toy.quick_config(), tmp_path, progress=False)
        assert [(r["task"], r["method"], r["seed"]) for r in res["runs"]] == [
            ("linear", "short", 0),
            ("linear", "long", 0),
        ]
        mse = {r["method"]: r["metrics"]["test_mse"] for r in res["runs"]}
        assert mse["long"] < mse["short"]  # twelve steps fit better than three
        assert all("model" not in row for row in res["summary"])
        assert "| linear | long | 1 |" in (tmp_path / "results.md").read_text()
        before = (tmp_path / "runs").stat().st_mtime_ns
        assert toy.run(toy.quick_config(), tmp_path, progress=False)["runs"] == res["runs"]  # resumed, not rerun
        assert (tmp_path / "runs").stat().st_mtime_ns == before
        ap = argparse.ArgumentParser()
        flags.add_flags(ap, toy.Config)
        cfg = flags.config_from_args(ap.parse_args(["--method", "long", "--steps", "8"]), toy.Config())
        assert (cfg.methods, cfg.steps) == (["long"], 8)
        with pytest.raises(MasklabError, match="unknown method 'medium'; choose from short, long"):
            toy.run(toy.Config(methods=["medium"]), tmp_path / "bad")
    finally:
        del sys.modules["masklab.lab.studies.toy"]


def test_design_example_is_a_gotu_design():
    from masklab.priors.structures import DESIGNS, design_structure
    from masklab.lab.studies import gotu

    run_example("design")
    try:
        s = design_structure("support-reads-all", [[0, 2]], 4, 0, 2, 2)  # support {0, 2}: tokens 1 and 3
        assert s.shape == (1, 5, 5)
        rows = {(i, j) for i, j in zip(*torch.nonzero(s[0] > 0.5, as_tuple=True)) if i != j}
        assert {(int(i), int(j)) for i, j in rows} == {(0, 1), (0, 3), (1, 0), (1, 3), (3, 0), (3, 1)}
        gotu.validate(gotu.Config(design="support-reads-all"))  # `masklab gotu --design support-reads-all` is accepted
    finally:
        del DESIGNS["support-reads-all"]


def test_qk_init_example_makes_attention_uniform():
    from masklab.models import TokenEncoder
    from masklab.priors.qk_init import QK_INITS
    from masklab.priors.structures import design_structure
    from masklab.lab.train import init_qk

    run_example("qk-init")
    try:
        torch.manual_seed(0)
        model = TokenEncoder(2, 6, 16, 2, 2)
        x = torch.randint(0, 2, (4, 6))
        structures = [design_structure("pairwise", [[0, 1]], 6, layer, 2, 2) for layer in range(2)]
        _, before = model(x, return_attn=True)
        init_qk("qk-zero", model, structures, 6.0, 6.0, lambda: x)
        _, after = model(x, return_attn=True)
        assert not torch.allclose(before[0], torch.full_like(before[0], 1 / 7))
        assert torch.allclose(after[0], torch.full_like(after[0], 1 / 7), atol=1e-6)
    finally:
        del QK_INITS["qk-zero"]


def test_search_example_finds_all_or_nothing():
    from masklab.lab.evidence.search import SEARCHES

    run_example("search")
    try:
        needs_item_2 = lambda keep: keep[:, 2]  # noqa: E731  the answer holds iff item 2 is visible
        found = SEARCHES["all-or-nothing"].find(needs_item_2, 5)
        assert (found.items, found.forward_passes) == ([0, 1, 2, 3, 4], 1)
        assert SEARCHES["all-or-nothing"].find(lambda keep: torch.ones(len(keep), dtype=torch.bool), 5).items == []
        assert SEARCHES["loo"].find(needs_item_2, 5).items == [2]  # the built-in search, for contrast
    finally:
        del SEARCHES["all-or-nothing"]


def test_router_example_scores_by_position():
    from masklab.lab.routing.routers import TOKEN_ROUTERS, build_router

    run_example("router")
    try:
        router = build_router("position", vocab=10)
        items = torch.randint(0, 10, (2, 4, 2))
        valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
        scores = router(items, torch.randint(0, 10, (2, 2)), valid)
        assert scores.shape == (2, 4) and torch.isinf(scores[0, 3]) and torch.isfinite(scores[1]).all()
        other = router(torch.randint(0, 10, (2, 4, 2)), torch.randint(0, 10, (2, 2)), valid)
        assert torch.equal(scores, other)  # content does not matter, only position
    finally:
        del TOKEN_ROUTERS["position"]


def test_selector_example_keeps_the_oldest():
    from masklab.lab.routing.sparse import SELECTORS, keep_mask
    from masklab.lab.tasks.evidence_gyms import make_gym

    run_example("selector")
    try:
        batch = make_gym("kv").sample(3, 8, np.random.default_rng(0))
        scores = SELECTORS["oldest"].score(None, batch, np.random.default_rng(0))
        keep = keep_mask(scores, batch.valid, 0.25)
        kept = [batch.positions[b][keep[b]].tolist() for b in range(3)]
        assert all(k == sorted(batch.positions[b][batch.valid[b]].tolist())[: len(k)] and k for b, k in enumerate(kept))
    finally:
        del SELECTORS["oldest"]


def test_architecture_example_makes_a_new_model_type_work():
    """Before the entry a StarCoder2 model is refused; after it, an all-allowed prior leaves
    its logits unchanged and its sliding layers are known."""
    transformers = pytest.importorskip("transformers")
    from masklab.priors.bias import RelativePrior
    from masklab.pretrained.hf import attach_priors
    from masklab.pretrained.arch import ARCHITECTURES, sliding_window_layers

    torch.manual_seed(0)
    cfg = transformers.Starcoder2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(MasklabError, match="'starcoder2' is not supported"):
        attach_priors(model, lambda i, h: RelativePrior(h))
    run_example("architecture")
    try:
        with torch.no_grad():
            ref = model(x).logits
            attach_priors(model, lambda i, h: RelativePrior(h, max_distance=16))
            torch.testing.assert_close(model(x).logits, ref, atol=1e-5, rtol=1e-5)
        assert sliding_window_layers(model) == [0, 1]
    finally:
        del ARCHITECTURES["starcoder2"]


def test_context_router_example_prunes_a_text():
    from masklab.context import Request, load_router
    from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported

    run_example("context-router")
    try:
        pruned = load_router("shortest").prune(
            Request("anything?", "A much longer first sentence than the rest here. Short one. Tiny.", fraction=0.3)
        )
        assert pruned.doc.units[pruned.kept[0]] == "Tiny." and pruned.kept_fraction <= 0.3 + 1e-9
    finally:
        del ROUTERS["shortest"]


def test_a_router_with_a_score_range_takes_a_threshold_and_keep_auto_everywhere(tmp_path, capsys):
    from masklab.cli import main
    from masklab.context import prune
    from masklab.context.api import _router
    from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported

    run_example("context-deciding-router")
    try:
        text = "One fact. Two facts. Three facts. Four facts."
        assert prune("Which?", text, threshold=0.5, router="first-half")["kept"] == [0, 1]
        assert prune("Which?", text, router="first-half")["kept"] == [0, 1]  # keep auto: its own 0.5
        doc = tmp_path / "d.txt"
        doc.write_text(text)
        for budget in (["--threshold", "0.5"], ["--keep", "auto"]):  # accepted: refused only at the unknown model
            assert (
                main(
                    [
                        "compress",
                        "--context",
                        str(doc),
                        "--question",
                        "Which?",
                        "--router",
                        "first-half",
                        *budget,
                        "--model",
                        "no-such",
                    ]
                )
                == 2
            )
            assert "no-such" in capsys.readouterr().err
    finally:
        del ROUTERS["first-half"]
        _router.cache_clear()
