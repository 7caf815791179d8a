"""Answer from a (pruned) context: greedy decoding timed apart from the router."""

from __future__ import annotations

import re
import time

import torch

from masklab.util import device as devices
from masklab.pretrained.lm import encode

SENTENCE_END = re.compile(r"(?<!\d)[.!?](?:\s|$)|\n\s*\S.*\n")
LINE_END = re.compile(r"\S.*\n")  # a first line with text, ended
NEXT_TURN = re.compile(r"\b(?:Question|Context)\s*:", re.I)  # the model starting the next turn of the prompt
ANSWER_ROOM = 16  # tokens kept free for the chat turns around the question


@torch.no_grad()
def generate_answer(
    lm,
    units: list[str],
    query: str,
    max_new_tokens: int = 10,
    stop_at_sentence: bool = False,
    stop_at_line: bool = False,
) -> dict:
    """Greedy continuation of ``" ".join(units) + query`` in ``lm``'s prompt format.

    ``stop_at_sentence`` stops after the first sentence end (or second line) of the answer,
    ``stop_at_line`` after its first line (:func:`first_answer` then cuts what a user sees).
    Returns ``{"generated", "seconds" (tokenise + prefill + decode), "prefill_seconds"
    (tokenise + prefill), "tokens" (prompt), "new_tokens", "stopped"}``; ``stopped``: why decoding
    stopped: ``"eos"``, ``"sentence"``, ``"line"``, or ``"length"`` (``max_new_tokens`` reached). On
    CUDA the prefill's clock is read after the GPU has finished it (:func:`masklab.util.device.synchronize`)."""
    t0 = time.perf_counter()
    enc = encode(lm, units, query)
    dev = lm.model.device
    out = lm.model(input_ids=enc.ids[None].to(dev), use_cache=True, logits_to_keep=1)
    devices.synchronize(dev)
    t1 = time.perf_counter()
    eos = lm.model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    new: list[int] = []
    stopped = "length"
    for _ in range(max_new_tokens):  # greedy, as generate(do_sample=False) decodes
        nxt = int(out.logits[0, -1].argmax())
        new.append(nxt)
        if nxt in eos:
            stopped = "eos"
            break
        if stop_at_sentence or stop_at_line:
            so_far = lm.tokenizer.decode(new, skip_special_tokens=True).lstrip()
            if stop_at_sentence and SENTENCE_END.search(so_far):
                stopped = "sentence"
                break
            if stop_at_line and LINE_END.search(so_far):
                stopped = "line"
                break
        if len(new) == max_new_tokens:
            break
        out = lm.model(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=out.past_key_values, use_cache=True)
    text = lm.tokenizer.decode(new, skip_special_tokens=True)
    return {
        "generated": text,
        "seconds": time.perf_counter() - t0,
        "prefill_seconds": t1 - t0,
        "tokens": int(enc.ids.numel()),
        "new_tokens": len(new),
        "stopped": stopped,
    }


def first_answer(text: str) -> str:
    """What a user is shown of a generated answer: its first line, up to its first sentence
    end, without a next ``Question:`` (or ``Context:``) the model went on to write and
    without a leading ``Answer:``; ``""`` when nothing is left."""
    t = re.sub(r"^\s*Answer\s*:", "", text.strip(), flags=re.I).strip()
    t = t.split("\n", 1)[0]
    t = NEXT_TURN.split(t, 1)[0]
    m = re.search(r"(?<!\d)[.!?](?=\s|$)", t)
    return (t[: m.end()] if m else t).strip()


CUT = " …"  # ends an answer that max_new_tokens cut before its first sentence ended


def shown_answer(generated: str, stopped: str) -> str:
    """:func:`first_answer` of ``generated``; where decoding stopped at ``max_new_tokens``
    (``stopped == "length"``) before the answer's first sentence or line ended, without its last
    word (the token cut may have split it) and ending in :data:`CUT`, so a cut answer never reads
    as a whole one."""
    text = first_answer(generated)
    ended = re.search(r"(?<!\d)[.!?](?=\s|$)", text) or "\n" in generated.strip()
    if stopped != "length" or not text or ended:
        return text
    return (text.rsplit(None, 1)[0] if " " in text else text) + CUT


def answer_budget(lm, question: str, max_new_tokens: int) -> tuple[int, int]:
    """``(window, overhead)``: the model's window in tokens, and the tokens the query
    (``Query(question).text``), the chat turns and the answer take of it (so the kept context
    may be at most ``window - overhead`` tokens)."""
    from masklab.text.query import Query

    window = int(getattr(lm.config, "max_position_embeddings", 2048))  # the config: no weights read
    return window, len(lm.tokenizer(Query(question).text)["input_ids"]) + ANSWER_ROOM + max_new_tokens
