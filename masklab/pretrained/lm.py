"""What the pretrained studies do with a causal LM: tokenise a context made of sentences,
generate greedily, score a fixed answer under key masks (one batched forward pass), and
read attention from the answer position.

Hiding a sentence by *masking* zeroes its tokens in the 2-D ``attention_mask`` (Hugging
Face turns that into a ``-inf`` bias on those keys for every query, exactly masklab's
``key_bias``); positions are passed explicitly so nothing else moves. Hiding by
*deletion* removes the sentence's text and re-tokenises.

Prompt formats (``lm.prompt_format``): ``raw`` is the plain completion
``context + query``; ``chat`` wraps it in the model's own user/assistant turns (a model
folder's tokenizer chat template when it has one, :func:`template_turns`; else
:data:`CHAT_TURNS`, found from the special tokens in its vocabulary) and moves the
answer line (:attr:`masklab.text.query.Query.answer_line`: ``Answer:`` and the answer prefix)
into the assistant turn::

    <|im_start|>user\n{context}\nQuestion: ...<|im_end|>\n<|im_start|>assistant\nAnswer: {prefix}

(no system turn: on the hand-written questions SmolLM2 answered the same with and
without its template's default system prompt, and starting the assistant turn with
``Answer:`` made it answer with the entity rather than restate the context).

Either way the context sits in one piece inside the text, so sentence/token maps only
shift by the length of the text before it (:func:`prompt_parts`).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from masklab.pretrained.models import LoadedModel
from masklab.text.query import Query
from masklab.util.errors import MasklabError

PROMPT_FORMATS = ("raw", "chat")
# chat turns for tokenizers without a chat template, by style:
# (marker token, user turn opening, user turn closing + assistant turn opening)
CHAT_TURNS = {
    "chatml": ("<|im_start|>", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
    "gemma": ("<start_of_turn>", "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"),
    "mistral": ("[INST]", "[INST] ", " [/INST]"),
    "phi3": ("<|user|>", "<|user|>\n", "<|end|>\n<|assistant|>\n"),
    "olmo2": ("<|user|>", "<|user|>\n", "\n<|assistant|>\n"),
}
_SLOT = "MASKLAB_USER_MESSAGE"  # rendered through a chat template to find where the message goes


def chat_turns(tokenizer, style: str | None = None) -> tuple[str, str]:
    """``(open, close)`` of the tokenizer's chat turns, recognised by a special token in its
    vocabulary: the architecture's ``style`` first (:mod:`masklab.pretrained.arch`), then
    any style of :data:`CHAT_TURNS` (ChatML's ``<|im_start|>``, Gemma's ``<start_of_turn>``, ...)."""
    vocab = tokenizer.get_vocab()
    for marker, opening, closing in ([CHAT_TURNS[style]] if style else []) + list(CHAT_TURNS.values()):
        if marker in vocab:
            return opening, closing
    markers = ", ".join(f"{k} {v[0]}" for k, v in CHAT_TURNS.items())
    raise MasklabError(
        f"this model's tokenizer has no chat template and its vocabulary no known chat-turn tokens "
        f"({markers}); use --prompt-format raw"
    )


def template_turns(tokenizer) -> tuple[str, str]:
    """``(open, close)`` from the tokenizer's own chat template: one user message rendered
    with the assistant turn opened, split at the message (so ``open`` holds whatever the
    template puts first: BOS, a default system turn). ``enable_thinking=False``: Qwen3's
    template then closes an empty thinking block, so the answer follows directly (other
    templates ignore the variable)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SLOT}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
    except Exception as e:  # jinja2 errors of a template that wants other messages
        raise MasklabError(
            f"the tokenizer's chat template does not render one user message ({e}); use --prompt-format raw"
        ) from None
    if not isinstance(text, str) or text.count(_SLOT) != 1:
        raise MasklabError(
            "the tokenizer's chat template does not place the user message once; use --prompt-format raw"
        )
    opening, closing = text.split(_SLOT)
    return opening, closing


def turns(lm: LoadedModel) -> tuple[str, str]:
    """``(open, close)`` of ``lm``'s chat prompt: the tokenizer's chat template for a model
    folder that has one (``lm.template_chat``), else :func:`chat_turns` with the
    architecture's style (the packaged models: SmolLM2's ChatML, Gemma's turns, as always)."""
    if getattr(lm, "template_chat", False):
        return template_turns(lm.tokenizer)
    from masklab.pretrained.arch import ARCHITECTURES

    mt = getattr(getattr(lm.model, "config", None), "model_type", None)
    return chat_turns(lm.tokenizer, ARCHITECTURES[mt].chat if mt in ARCHITECTURES else None)


def prompt_parts(lm: LoadedModel, query: str) -> tuple[str, str]:
    """``(before, after)``: the formatted prompt is ``before + context + after``. In the chat
    format a :class:`~masklab.text.query.Query`'s question ends the user turn and its answer line
    starts the assistant's; any other query text is all user turn."""
    fmt = getattr(lm, "prompt_format", "raw")
    if fmt == "raw":
        return "", query
    if fmt != "chat":
        raise MasklabError(f"unknown prompt format {fmt!r}: use one of {', '.join(PROMPT_FORMATS)}")
    opening, closing = turns(lm)
    q = Query.parse(query)
    if q.text != query:
        return opening, query + closing
    return opening, q.question_line + closing + q.answer_line


def chat_template(lm: LoadedModel) -> str | None:
    """A one-turn Jinja chat template that renders ``lm``'s prompt format around a user
    message (for the peers, which format prompts through the tokenizer's chat template):
    None for ``raw``; for ``chat``, BOS (unless the turn starts with it) + user turn +
    assistant opening, so ``apply_chat_template`` yields ``before + message + closing``."""
    if getattr(lm, "prompt_format", "raw") == "raw":
        return None
    opening, closing = turns(lm)
    bos = lm.tokenizer.bos_token
    lead = "" if bos and opening.startswith(bos) else "{{ bos_token }}"
    esc = lambda t: t.replace("\n", "\\n").replace("'", "\\'")  # noqa: E731
    return (
        lead + "{{ '" + esc(opening) + "' }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{{ '" + esc(closing) + "' }}"
    )


@dataclass
class Encoded:
    """A tokenised prompt. ``ids (T,)``; ``item_of_token (T,)`` = sentence index of each
    token (-1 for BOS / chat-turn / query tokens); ``context_len`` = tokens up to the end
    of the context; ``context_start`` = character offset of the context inside ``text``."""

    ids: Tensor
    offsets: list[tuple[int, int]]
    item_of_token: Tensor
    context_len: int
    text: str
    context_start: int = 0

    def token_mask(self, spans: list[tuple[int, int]]) -> Tensor:
        """``(T,)`` bool: tokens overlapping any character span ``[a, b)``, given as offsets
        into the unformatted ``context + query`` (as :class:`StalePrompt` spans are)."""
        out = torch.zeros(len(self.offsets), dtype=torch.bool)
        c = self.context_start
        for t, (a, b) in enumerate(self.offsets):
            if b > a and any(a < e + c and s + c < b for s, e in spans):
                out[t] = True
        return out


def encode(lm: LoadedModel, sentences: list[str], query: str) -> Encoded:
    """Tokenise ``" ".join(sentences)`` and ``query`` in ``lm``'s prompt format (with the
    tokenizer's BOS) and map every token to its sentence."""
    context = " ".join(sentences)
    before, after = prompt_parts(lm, query)
    text = before + context + after
    c0, c1 = len(before), len(before) + len(context)
    # BOS, unless the chat turn already starts with it (SmolLM2's BOS is <|im_start|>)
    bos = lm.tokenizer.bos_token
    add_bos = not (before and bos and before.startswith(bos))
    enc = lm.tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_bos)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    starts, pos = [], c0
    for s in sentences:
        starts.append((pos, pos + len(s)))
        pos += len(s) + 1
    first = [s for s, _ in starts]  # sorted: each token's sentence is found by bisection, not a scan
    item = torch.full((len(offsets),), -1, dtype=torch.long)
    for t, (a, b) in enumerate(offsets):
        if b <= a or a >= c1 or b <= c0:
            continue
        mid = a if text[a] != " " else min(a + 1, b - 1)
        mid = max(mid, c0)
        i = bisect.bisect_right(first, mid) - 1  # the sentence spans [s, e + 1) tile the context in order
        if i >= 0 and mid < starts[i][1] + 1:
            item[t] = i
    ctx_tokens = [t for t, (a, b) in enumerate(offsets) if b > a and c0 <= a < c1]
    context_len = (max(ctx_tokens) + 1) if ctx_tokens else 1
    return Encoded(torch.tensor(enc["input_ids"]), offsets, item, context_len, text, c0)


HEAD_END = re.compile(r"[.,;:!?\n]")  # where the scored answer head ends (tasks.stale_prompts.answer_head)


def _head_complete(tokenizer, start: int):
    """A stopping criterion: the continuation after position ``start`` holds a head-ending
    mark after its leading whitespace, so no further token can change its answer head."""
    from transformers import StoppingCriteria

    class HeadComplete(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            text = tokenizer.decode(input_ids[0, start:], skip_special_tokens=True).strip()
            return torch.full(
                (input_ids.shape[0],), bool(HEAD_END.search(text)), dtype=torch.bool, device=input_ids.device
            )

    return HeadComplete()


@torch.no_grad()
def generate(
    lm: LoadedModel, ids: Tensor, max_new_tokens: int = 8, stop_at_head: bool = False, cache=None
) -> tuple[Tensor, str]:
    """Greedy continuation of ``ids (T,)``: ``(new_ids (n,), text)``. ``stop_at_head``: stop
    as soon as the answer head is complete (the first punctuation mark or line break after
    some text), which leaves the head the same and saves the remaining tokens. ``cache``: an
    empty ``DynamicCache`` that keeps the keys and values of every token read (its first
    ``T`` positions are :func:`context_cache` of ``ids``)."""
    ids = ids.to(lm.model.device)  # the model's device (a no-op on the CPU)
    kw = {} if cache is None else {"past_key_values": cache}
    if stop_at_head:
        from transformers import StoppingCriteriaList

        kw["stopping_criteria"] = StoppingCriteriaList([_head_complete(lm.tokenizer, ids.numel())])
    out = lm.model.generate(
        ids[None],
        attention_mask=torch.ones_like(ids)[None],
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=lm.tokenizer.pad_token_id,
        **kw,
    )
    new = out[0, ids.numel() :].cpu()
    return new, lm.tokenizer.decode(new, skip_special_tokens=True)


def answer_tokens(lm: LoadedModel, new_ids: Tensor, head: str) -> Tensor:
    """The prefix of the generated ids that spells ``head`` (the scored answer)."""
    for n in range(1, new_ids.numel() + 1):
        if head.strip() and head.strip() in lm.tokenizer.decode(new_ids[:n], skip_special_tokens=True):
            return new_ids[:n]
    return new_ids[:1]


@torch.no_grad()
def context_cache(lm: LoadedModel, ids: Tensor, cache=None) -> list[tuple[Tensor, Tensor]]:
    """Every layer's keys and values after reading ``ids (T,)`` with nothing hidden, as
    ``(keys, values)`` of shape ``(1, KV heads, T, head dim)``: all ``T`` positions, also on
    layers that slide (their window is applied by the attention mask, not by the cache).
    ``cache``: a ``DynamicCache`` that already read ``ids`` (and maybe more, as
    :func:`generate`'s does): its first ``T`` positions, without a pass."""
    from transformers import DynamicCache

    if cache is None:
        cache = DynamicCache()
        lm.model(input_ids=ids[None].to(lm.model.device), past_key_values=cache, use_cache=True, logits_to_keep=1)
    T = ids.numel()
    return [(layer.keys[:, :, :T], layer.values[:, :, :T]) for layer in cache.layers]


def cached(prefix: list[tuple[Tensor, Tensor]], start: int, batch: int = 1):
    """A ``DynamicCache`` holding the first ``start`` positions of ``prefix``
    (:func:`context_cache`), repeated ``batch`` times."""
    from transformers import DynamicCache

    return DynamicCache(
        [(k[:, :, :start].expand(batch, -1, -1, -1), v[:, :, :start].expand(batch, -1, -1, -1)) for k, v in prefix]
    )


@torch.no_grad()
def answer_scores(
    lm: LoadedModel,
    ids: Tensor,
    answer: Tensor,
    keep_tokens: Tensor,
    batch: int = 8,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    via: str = "mask",
    prefix: list[tuple[Tensor, Tensor]] | None = None,
) -> tuple[Tensor, Tensor]:
    """Teacher-force ``answer (A,)`` after ``ids (T,)`` under key masks ``keep_tokens (V, T)``.

    ``via="mask"`` hides keys through the 2-D ``attention_mask`` (every layer and head);
    ``via="hide"`` through :func:`masklab.pretrained.hf.hide`, only in ``layers`` / ``heads`` (None = all).
    ``prefix``: :func:`context_cache` of ``ids`` (``via="mask"`` only). A token before a
    batch's first hidden one reads exactly what it reads with nothing hidden, so its keys and
    values are taken from there and the model reads only the rest: the same scores, fewer
    tokens read.
    Returns ``logp (V,)`` (sum of the answer tokens' log-probabilities) and ``greedy (V,)``
    (True where every answer token is still the argmax, i.e. greedy decoding reproduces it).
    """
    if prefix is not None and via != "mask":
        raise MasklabError("a cached prefix needs via='mask'")
    dev = lm.model.device  # inputs go to the model's device, results come back to the CPU
    ids, answer, keep_tokens = ids.to(dev), answer.to(dev), keep_tokens.to(dev)
    full = torch.cat([ids, answer])
    T, A = ids.numel(), answer.numel()
    logps, greedys = [], []
    for s in range(0, keep_tokens.shape[0], batch):
        keep = keep_tokens[s : s + batch]
        V = keep.shape[0]
        mask = torch.cat([keep.long(), torch.ones(V, A, dtype=torch.long, device=dev)], dim=1)
        pos = torch.arange(T + A, device=dev)[None].expand(V, -1)
        # read from the batch's first hidden token on (at most T - 1: the logits at T - 1 predict the answer)
        start = 0 if prefix is None else min(int(torch.where(keep.all(1), T, (~keep).int().argmax(1)).min()), T - 1)
        if start > 0:
            logits = (
                lm.model(
                    input_ids=full[start:][None].expand(V, -1),
                    attention_mask=mask,
                    position_ids=pos[:, start:],
                    past_key_values=cached(prefix, start, V),
                    use_cache=True,
                    logits_to_keep=A + 1,
                )
                .logits[:, :A]
                .float()
            )
        elif via == "hide":
            from masklab.pretrained.hf import hide

            with hide(lm.model, keep=mask.bool(), layers=layers, heads=heads):
                logits = (
                    lm.model(input_ids=full[None].expand(V, -1), position_ids=pos, logits_to_keep=A + 1)
                    .logits[:, :A]
                    .float()
                )
        else:
            logits = (
                lm.model(
                    input_ids=full[None].expand(V, -1), attention_mask=mask, position_ids=pos, logits_to_keep=A + 1
                )
                .logits[:, :A]
                .float()
            )  # (V, A, vocab)
        lp = torch.log_softmax(logits, -1)
        logps.append(lp.gather(-1, answer[None, :, None].expand(V, -1, 1))[..., 0].sum(-1))
        greedys.append((logits.argmax(-1) == answer[None]).all(-1))
    return torch.cat(logps).cpu(), torch.cat(greedys).cpu()


@torch.no_grad()
def last_token_attention(lm: LoadedModel, ids: Tensor, prefix: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """Attention probabilities from the last position of ``ids (T,)``: ``(L, H, T)``.
    ``prefix``: :func:`context_cache` of ``ids``; only the last token is read.

    Needs the model in eager attention mode (``set_attention(lm, "eager")``)."""
    dev = lm.model.device
    if prefix is not None and ids.numel() > 1:
        T = ids.numel()
        out = lm.model(
            input_ids=ids[None, -1:].to(dev),
            position_ids=torch.tensor([[T - 1]], device=dev),
            past_key_values=cached(prefix, T - 1),
            use_cache=True,
            output_attentions=True,
        )
    else:
        out = lm.model(input_ids=ids[None].to(dev), output_attentions=True, logits_to_keep=1)
    if out.attentions is None or out.attentions[0] is None:
        raise RuntimeError("the model returned no attention probabilities; load it with attn='eager'")
    return torch.stack([a[0, :, -1, :] for a in out.attentions]).float().cpu()
