"""``longllmlingua``: Microsoft's question-aware prompt compressor (``llmlingua==0.2.2``,
``rank_method="longllmlingua"``), scoring with the same loaded LM as every other router.

It rewrites the text (coarse: ranks passages, consecutive units of at most
:data:`PASSAGE_TOKENS` tokens, by the question's perplexity given each; fine: drops tokens
inside them), so it keeps no whole units: :meth:`choose` returns the
compressed text. Settings are its README's recommended ones for LongLLMLingua
(``condition_in_question="after_condition"``, ``reorder_context="sort"``,
``dynamic_context_compression_ratio=0.3``, ``condition_compare=True``,
``context_budget="+100"``) with ``rate`` = the kept fraction; it may keep more than that
(its budget rules), and the kept fraction reported is what it really kept.

Two patches make 0.2.2 run offline on transformers 4.57, both here: its constructor builds
a tiktoken encoder for ``gpt-3.5-turbo`` (a download), which is replaced for the
constructor's duration by an encoder over the model's own tokenizer (llmlingua counts
tokens with it); and it passes the KV cache to the model as a plain list of ``(k, v)``
pairs in its iterative compression, which :class:`_Compressor` wraps in a ``DynamicCache``
(and unwraps on the way back).
"""

from __future__ import annotations

import copy
import time

from masklab.context.router import Pruned
from masklab.lab.routers.registry import REWRITERS, Rewriter
from masklab.util.errors import MasklabError
from masklab.pretrained.models import PRETRAINED_EXTRA, require


PASSAGE_TOKENS = 128  # its documents: consecutive units of at most this many tokens (it ranks passages, not sentences)


class ModelTokenizerEncoding:
    """The two methods of a tiktoken ``Encoding`` llmlingua uses, on a Hugging Face tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, **_) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def compressor(lm):
    """A ``llmlingua.PromptCompressor`` over ``lm``'s model and a copy of its tokenizer."""
    require("llmlingua", f"{PRETRAINED_EXTRA}   (or: pip install llmlingua==0.2.2)")
    import llmlingua.prompt_compressor as pc
    from transformers import DynamicCache

    class _Compressor(pc.PromptCompressor):
        def load_model(self, model_name, device_map="cpu", model_config=None):
            tok = copy.deepcopy(lm.tokenizer)
            tok.padding_side = "left"
            tok.pad_token_id = lm.model.config.pad_token_id or tok.eos_token_id
            self.tokenizer, self.model, self.device = tok, lm.model, str(lm.model.device)
            self.context_idxs = []
            self.max_position_embeddings = lm.model.config.max_position_embeddings

        def get_ppl(
            self,
            text,
            granularity="sentence",
            input_ids=None,
            attention_mask=None,
            past_key_values=None,
            return_kv=False,
            end=None,
            condition_mode="none",
            condition_pos_id=0,
        ):
            if past_key_values is not None and not isinstance(past_key_values, DynamicCache):
                past_key_values = DynamicCache.from_legacy_cache(tuple((k, v) for k, v in past_key_values))
            out = super().get_ppl(
                text,
                granularity,
                input_ids,
                attention_mask,
                past_key_values,
                return_kv,
                end,
                condition_mode,
                condition_pos_id,
            )
            if return_kv and isinstance(out[1], DynamicCache):
                return out[0], [list(kv) for kv in out[1].to_legacy_cache()]
            return out

    real = pc.tiktoken.encoding_for_model
    pc.tiktoken.encoding_for_model = lambda name: ModelTokenizerEncoding(lm.tokenizer)
    try:
        return _Compressor(model_name=lm.name, device_map="cpu")
    finally:
        pc.tiktoken.encoding_for_model = real


@REWRITERS.register("longllmlingua")
class LongLLMLingua(Rewriter):
    """LongLLMLingua (module docstring)."""

    reads_model = True
    use = "the question-aware peer, for comparison: it rewrites the text token by token (slow on a CPU)"

    def __init__(self, lm=None) -> None:
        super().__init__(lm)
        self._compressor = None

    def choose(self, doc, question, keep, fill=None, limit=None) -> Pruned:
        if self._compressor is None:
            self._compressor = compressor(self.lm)
        from masklab.lab.linear_routers import chunk_units

        lengths = doc.lengths(self.tokenizer)
        passages = [" ".join(doc.units[i] for i in c) for c in chunk_units(lengths, PASSAGE_TOKENS)]
        t0 = time.perf_counter()
        out = self._compressor.compress_prompt(
            passages,
            question=question,
            rate=keep,
            condition_in_question="after_condition",
            reorder_context="sort",
            dynamic_context_compression_ratio=0.3,
            condition_compare=True,
            context_budget="+100",
            rank_method="longllmlingua",
        )
        seconds = time.perf_counter() - t0
        text = out["compressed_prompt"]
        if text.rstrip().endswith(question.strip()):  # it appends the question: the caller asks it
            text = text.rstrip()[: -len(question.strip())].rstrip()
        n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if limit is not None and n > limit:
            raise MasklabError(f"longllmlingua kept {n} tokens, over the {limit} that fit the model")
        return Pruned(doc, [], [], lengths, seconds, self.name, compressed=text, compressed_tokens=n)
