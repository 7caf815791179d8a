"""Real models on hand-written contexts (not made by masklab's generators), each prompted in
its default format: the answer names the right entity and the evidence holds the sentence
that states it. Plus: an empty answer is never explained (exit code 2, one message).

Slow (real models); skipped only when a model's package is missing.
"""

import pytest

from masklab.lab.runner import MasklabError

pytestmark = pytest.mark.slow

FIXTURES = {"smollm2-135m": "smol", "gemma3-270m": "gemma"}  # tests/conftest.py: loaded once per session

OBSERVATORY = [
    "The Kestrel Ridge Observatory was founded in 1903 on a hill above the town of Alden.",
    "Its first director was the astronomer Helen Marsh, who had studied in Edinburgh.",
    "Under her leadership the observatory installed a large refracting telescope in 1921.",
    "The telescope was used mainly to photograph variable stars.",
    "Helen Marsh retired in 1949 and was succeeded by Arthur Penn.",
    "The observatory was closed to visitors during the war years.",
    "Today the building houses a small museum of scientific instruments.",
]
FERRY = [
    "The ferry to Carrow Island leaves from the north pier.",
    "The crossing takes forty minutes in calm weather.",
    "The captain of the ferry is a woman named Ingrid Vale.",
    "Tickets can be bought on board.",
    "In winter the ferry runs only twice a day.",
]
CASES = [  # (sentences, question, entity, index of the sentence that states it)
    (OBSERVATORY, "Who succeeded Helen Marsh as director?", "Arthur Penn", 4),
    (FERRY, "Who is the captain of the ferry?", "Ingrid Vale", 2),
]


@pytest.mark.parametrize("name", list(FIXTURES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_answer_names_the_entity_and_evidence_holds_its_sentence(name, case, request):
    from masklab.lab.lm_evidence import cite

    lm = request.getfixturevalue(FIXTURES[name])
    sentences, question, entity, gold = CASES[case]
    res = cite(lm, sentences, question, method="group-testing")
    assert entity in res["answer"], (lm.prompt_format, res["answer"])
    assert gold in res["evidence"], res


@pytest.mark.parametrize("name", list(FIXTURES))
def test_chat_prompt_keeps_the_context_tokens_in_place(name, request):
    """In the chat format every context token still maps to its own sentence (so masking
    a sentence hides exactly its tokens) and the answer prefix sits in the assistant turn."""
    from masklab.pretrained.lm import chat_turns, encode

    lm = request.getfixturevalue(FIXTURES[name])
    old = lm.prompt_format
    lm.prompt_format = "chat"
    try:
        enc = encode(lm, FERRY, "\nQuestion: Who is the captain?\nAnswer: The captain is")
    finally:
        lm.prompt_format = old
    opening, closing = chat_turns(lm.tokenizer)
    assert enc.text.startswith(opening) and enc.text.endswith(closing + "Answer: The captain is")
    assert enc.context_start == len(opening)
    for i, s in enumerate(FERRY):
        toks = [t for t in range(enc.ids.numel()) if enc.item_of_token[t] == i]
        spelled = lm.tokenizer.decode(enc.ids[toks]).strip()
        assert spelled == s, (i, spelled)
    # a span given in the unformatted prompt's offsets lands on the same words
    a = " ".join(FERRY).index("Ingrid Vale")
    picked = lm.tokenizer.decode(enc.ids[enc.token_mask([(a, a + len("Ingrid Vale"))])]).strip()
    assert picked == "Ingrid Vale"
    # specials: one BOS at most (SmolLM2's BOS is its turn opener)
    ids = enc.ids.tolist()
    assert ids[:2] != [ids[0], ids[0]]


def test_empty_answer_is_refused_with_exit_code_2(smol, shared_loads, tmp_path, capsys):
    """SmolLM2 prompted as a raw completion answers this question with nothing."""
    lm = smol
    from masklab.cli import main
    from masklab.lab.lm_evidence import EmptyAnswer, cite

    old = lm.prompt_format
    lm.prompt_format = "raw"
    try:
        with pytest.raises(EmptyAnswer, match="--prompt-format chat"):
            cite(lm, OBSERVATORY, "Who succeeded Helen Marsh as director?", method="loo")
    finally:
        lm.prompt_format = old
    ctx = tmp_path / "ctx.txt"
    ctx.write_text(" ".join(OBSERVATORY))
    rc = main(
        [
            "cite",
            "--model",
            "smollm2-135m",
            "--context",
            str(ctx),
            "--query",
            "Who succeeded Helen Marsh as director?",
            "--prompt-format",
            "raw",
            "--threads",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("masklab: error:") == 1 and "empty answer" in err and "--prompt-format chat" in err
    assert isinstance(EmptyAnswer("x"), MasklabError)
