"""One result shape: the JSON keys of ``masklab compress --json``, ``POST /v1/compress`` (what
``serve.compress_request`` returns) and ``masklab.context.prune()`` are the ones docs/context.md
lists once, between ``<!-- result-keys -->`` markers, each where the list says it is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import needs_hf, save_tiny_folder
from test_compress import REPORT, TRAVEL

from masklab.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs" / "context.md"
QUESTION = "Who approved the budget?"


def listed() -> dict[str, str]:
    """key -> where docs/context.md says it is (``all``, ``compress and serve``, ...)."""
    text = DOCS.read_text()
    table = text[text.index("<!-- result-keys -->") : text.index("<!-- /result-keys -->")]
    out = {}
    for row in table.splitlines()[3:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for key in re.findall(r"`([a-z_]+)`", cells[0]):
            out[key] = cells[-1]
    return out


def where(*places: str) -> set[str]:
    return {k for k, w in listed().items() if w in places}


def test_the_list_is_read():
    keys = listed()
    assert {"pruned_text", "pruned_context", "compression_rate", "model_window", "full_answer"} <= set(keys)
    assert set(keys.values()) == {
        "all",
        "all, when set",
        "compress and serve",
        "with an answer",
        "compress --compare-full",
    }


@pytest.fixture
def share():
    """``lexical-share``: the lexical router declaring its scores' range (so it takes a threshold)."""
    from masklab.context.api import _router
    from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported
    from masklab.context.routers.lexical import Lexical

    ROUTERS.register("lexical-share")(type("LexicalShare", (Lexical,), {"score_range": (0.0, 1.0)}))
    yield
    del ROUTERS["lexical-share"]
    _router.cache_clear()


def test_prune_returns_the_listed_keys(share):
    from masklab.context import prune

    out = prune(QUESTION, REPORT, keep=0.3, router="bm25")
    assert set(out) == where("all")
    assert set(prune(QUESTION, REPORT, threshold=0.5, router="lexical-share")) == where("all", "all, when set")
    assert out["pruned_context"] == out["pruned_text"] and out["seconds"] == out["router_seconds"]
    assert out["compression_rate"] == pytest.approx(1 - out["kept_fraction"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_folder(tmp_path_factory.mktemp("tiny-llama"), "llama", max_positions=4096)


@needs_hf
@pytest.mark.parametrize("several", [False, True])
def test_compress_json_and_the_service_return_the_listed_keys(folder, tmp_path, capsys, several):
    from masklab.context import serve
    from masklab.context.routers import load_router
    from masklab.pretrained.models import load

    texts = [REPORT, TRAVEL] if several else [REPORT]
    paths = []
    for i, t in enumerate(texts):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_text(t)
    argv = [
        "compress",
        "--model",
        str(folder),
        "--context",
        *map(str, paths),
        "--question",
        QUESTION,
        "--router",
        "bm25",
        "--unit-tokens",
        "400",
        "--json",
        "--answer",
        "--max-new-tokens",
        "2",
    ]
    assert main(argv + ([] if several else ["--compare-full"])) == 0
    out = json.loads(capsys.readouterr().out)
    want = where("all", "compress and serve", "with an answer")
    want |= set() if several else where("compress --compare-full")
    assert set(out) == want
    cfg = serve.ServeConfig(model=str(folder), unit_tokens=400)
    lm = load(str(folder))
    body = {
        "context": texts if several else REPORT,
        "question": QUESTION,
        "router": "bm25",
        "answer": True,
        "max_new_tokens": 2,
    }
    req = serve.parse_request(json.dumps(body).encode(), cfg)
    served = serve.compress_request(lm, load_router("bm25", lm), req, cfg)
    assert set(served) == where("all", "compress and serve", "with an answer")
    assert served["kept"] == out["kept"] and served["units"] == out["units"]  # the same request, the same result
