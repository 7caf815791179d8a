"""masklab.text.query.Query: the prompt tail's text, its parse back, and where a chat prompt splits it."""

import random
from types import SimpleNamespace

import pytest

from masklab.pretrained.lm import CHAT_TURNS, prompt_parts
from masklab.text.query import Query
from masklab.lab.tasks.longctx import make_example
from masklab.lab.tasks.stale_prompts import make_prompt


def test_text_and_round_trip():
    q = Query("Where does Omar live now?", "Omar lives in")
    assert q.text == "\nQuestion: Where does Omar live now?\nAnswer: Omar lives in"
    assert (q.question_line, q.answer_line) == ("\nQuestion: Where does Omar live now?", "Answer: Omar lives in")
    assert Query.parse(q.text) == q


def test_without_prefix_the_text_ends_at_answer():
    q = Query("Which river?")
    assert q.text == "\nQuestion: Which river?\nAnswer:" and q.answer_line == "Answer:"
    assert Query.parse(q.text) == q


@pytest.mark.parametrize(
    "query",
    [
        Query("Which river?").text,
        Query("Where does Omar live now?", "Omar lives in").text,
        make_example("vt", 256, 0).query,
        make_prompt(random.Random(0)).query,
    ],
)
def test_chat_prompt_splits_the_query_between_its_question_and_answer_lines(query):
    """The chat turns go where the query text breaks from its question line to its answer
    line (the last ``"\\nAnswer:"``); the raw format keeps the text as it is."""
    _, opening, closing = CHAT_TURNS["chatml"]
    vocab = {"<|im_start|>": 0}
    lm = SimpleNamespace(prompt_format="chat", model=None, tokenizer=SimpleNamespace(get_vocab=lambda: vocab))
    head, _, tail = query.rpartition("\nAnswer:")
    assert prompt_parts(lm, query) == (opening, head + closing + "Answer:" + tail)
    q = Query.parse(query)
    assert q.text == query and (q.question_line, q.answer_line) == (head, "Answer:" + tail)
    lm.prompt_format = "raw"
    assert prompt_parts(lm, query) == ("", query)


def test_chat_prompt_keeps_other_query_text_whole_in_the_user_turn():
    _, opening, closing = CHAT_TURNS["chatml"]
    vocab = {"<|im_start|>": 0}
    lm = SimpleNamespace(prompt_format="chat", model=None, tokenizer=SimpleNamespace(get_vocab=lambda: vocab))
    for query in ["\nQ?\nAnswer: A", "\nWho approved it?", "\nQuestion: Q?\nAnswer:X"]:
        assert prompt_parts(lm, query) == (opening, query + closing)
