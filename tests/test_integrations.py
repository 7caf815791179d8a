"""masklab's routers in LangChain (a ``BaseDocumentCompressor``) and LlamaIndex (a
``BaseNodePostprocessor``), against the real packages (the ``langchain`` and ``llamaindex``
extras; skipped where absent), with the bm25 router on documents written by hand."""

import pytest
from test_compress import ANSWERING, REPORT, TRAVEL

from masklab.text.document import count_tokens
from masklab.util.errors import MasklabError

QUESTION = "Who approved the budget?"
NOISE = "The weather was mild all week and the garden needed water."
TEXTS = [TRAVEL, REPORT, "   ", NOISE]


def test_langchain_compressor_prunes_documents_for_the_query():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import BaseDocumentCompressor, Document

    from masklab.integrations.langchain import MasklabCompressor

    docs = [Document(page_content=t, metadata={"source": f"doc{i}"}, id=f"id{i}") for i, t in enumerate(TEXTS)]
    compressor = MasklabCompressor(router="bm25", keep=0.2)
    assert isinstance(compressor, BaseDocumentCompressor)
    out = compressor.compress_documents(docs, QUESTION)
    sources = [d.metadata["source"] for d in out]
    assert "doc1" in sources and "doc2" not in sources and sources == sorted(sources)  # order kept, blank dropped
    budget = next(d for d in out if d.metadata["source"] == "doc1")
    assert ANSWERING in budget.page_content and budget.id == "id1" and budget.metadata["masklab"]["rank"] == 0
    kept = sum(d.metadata["masklab"]["kept_tokens"] for d in out)
    assert 0 < kept <= 0.2 * sum(count_tokens(None, t) for t in TEXTS)  # one budget over all (words: no model)
    assert all(len(d.page_content) < len(TEXTS[int(d.metadata["source"][3:])]) for d in out)
    few = MasklabCompressor(target_tokens=30).compress_documents(docs, QUESTION)
    assert [d.metadata["source"] for d in few] == ["doc1"] and ANSWERING in few[0].page_content
    assert MasklabCompressor().compress_documents([], QUESTION) == []


def test_llamaindex_postprocessor_prunes_nodes_for_the_query():
    pytest.importorskip("llama_index.core")
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from masklab.integrations.llamaindex import MasklabPostprocessor

    nodes = [
        NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata={"i": i}), score=1 - i / 10)
        for i, t in enumerate(TEXTS)
    ]
    post = MasklabPostprocessor(router="bm25", target_tokens=30)
    assert isinstance(post, BaseNodePostprocessor)
    out = post.postprocess_nodes(nodes, query_str=QUESTION)
    assert len(out) == 1 and out[0].node.node_id == "n1" and out[0].score == pytest.approx(0.9)
    assert (
        ANSWERING in out[0].node.text
        and out[0].node.metadata["i"] == 1
        and out[0].node.metadata["masklab"]["rank"] == 0
    )
    assert nodes[1].node.text == REPORT  # the retrieved nodes are not changed
    wide = MasklabPostprocessor(keep=0.5).postprocess_nodes(nodes, QueryBundle(QUESTION))
    assert [n.node.metadata["i"] for n in wide] == sorted(n.node.metadata["i"] for n in wide) and len(wide) >= 2
    with pytest.raises(MasklabError, match="prunes for a query"):
        post.postprocess_nodes(nodes)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"router": "nope"}, "unknown router 'nope'"),
        ({"keep": 0}, r"keep must be a fraction in \(0, 1\]"),
        ({"target_tokens": 0}, "target_tokens must be at least 1"),
        ({"unit_tokens": 0}, "unit_tokens must be a whole number"),
        ({"router": "bm25", "threshold": 0.5}, "needs a router that decides how much to keep"),
        ({"router": "pruner-ctx", "threshold": 1.5}, r"must be a number in \[0, 1\]"),
        ({"router": "pruner-ctx", "threshold": 0.5, "target_tokens": 30}, "each set the budget"),
    ],
)
@pytest.mark.parametrize("which", ["langchain", "llamaindex"])
def test_bad_settings_are_one_clear_error_at_construction(which, kwargs, match):
    if which == "langchain":
        pytest.importorskip("langchain_core")
        from masklab.integrations.langchain import MasklabCompressor as cls
    else:
        pytest.importorskip("llama_index.core")
        from masklab.integrations.llamaindex import MasklabPostprocessor as cls
    with pytest.raises(MasklabError, match=match):
        cls(**kwargs)
