"""The one table of Hugging Face decoder architectures masklab runs on.

One :class:`Architecture` entry per ``config.model_type`` says what masklab needs to know
about a ``transformers`` causal LM, so that :mod:`masklab.pretrained.hf` (priors, hiding), the
routers' first-layers pass and the context press never hard-code a model's attribute
paths. Adding an architecture is one more ``Architecture(...)`` line in
:data:`ARCHITECTURES` below, or from outside this module::

    ARCHITECTURES.register("starcoder2")(Architecture("starcoder2", "StarCoder2", sliding="all"))

(an architecture whose attention module calls ``transformers``' attention interface, as
every current decoder does; the tests on tiny random configs show whether it works).

Everything is read from the entry and the model's config:

* :func:`base_model` - the decoder stack (``model.model`` in every entry so far), which
  takes ``input_ids`` / ``position_ids`` and returns ``last_hidden_state`` after the
  final norm;
* :func:`decoder_layers` - the ``nn.ModuleList`` of decoder layers; :func:`final_norm`;
  :func:`attention_modules` - each layer's self-attention; :func:`first_layers` - run the
  base model through its first ``k`` layers only (the routers' cheap pass);
* :func:`kv_heads` - key/value heads (grouped-query attention: fewer than query heads);
* :func:`sliding_window_layers` - the layers that attend only within a window;
* ``positions`` - how positions reach the model (every entry: rotary embeddings computed
  from ``position_ids`` by the base model; ``rope-local-global``: a second RoPE table for
  the sliding layers); the attention sees absolute positions through ``cache_position``;
* ``chat`` - the chat turns (a :data:`masklab.pretrained.lm.CHAT_TURNS` style) to use when
  the tokenizer has no chat template of its own.

:func:`arch_of` refuses any other model type with one :class:`MasklabError` naming the
supported ones.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from torch import nn

from masklab.util.errors import MasklabError
from masklab.util.registry import Registry


@dataclass(frozen=True)
class Architecture:
    """What masklab needs to know about one Hugging Face decoder architecture.

    model_type: ``config.model_type``; name: for people; base: attribute path from the
    causal LM to the decoder stack (dots allowed); layers / norm: attributes of the base
    (decoder layers, final norm); attention: attribute of each layer (the module that calls
    the attention function); kv_heads: config attribute with the number
    of key/value heads; sliding: which layers use a sliding window (``"none"``;
    ``"layer_types"``: those marked ``sliding_attention`` in ``config.layer_types``;
    ``"all"``: every layer when ``config.sliding_window`` is set); positions: see the module
    docstring; chat: CHAT_TURNS style or None; needed: what it took beyond the defaults.
    """

    model_type: str
    name: str
    base: str = "model"
    layers: str = "layers"
    norm: str = "norm"
    attention: str = "self_attn"
    kv_heads: str = "num_key_value_heads"
    sliding: str = "none"
    positions: str = "rope"
    chat: str | None = None
    needed: str = ""


ARCHITECTURES: Registry[Architecture] = Registry(
    "architecture",
    items={
        a.model_type: a
        for a in (
            Architecture("llama", "Llama family (Llama 2/3, SmolLM2)", needed="nothing: the defaults are Llama's"),
            Architecture(
                "qwen2",
                "Qwen2 / Qwen2.5",
                sliding="layer_types",
                chat="chatml",
                needed="sliding layers from layer_types (use_sliding_window, max_window_layers)",
            ),
            Architecture(
                "qwen3",
                "Qwen3",
                sliding="layer_types",
                chat="chatml",
                needed="as Qwen2; q/k norms live inside the attention module",
            ),
            Architecture(
                "mistral",
                "Mistral",
                sliding="all",
                chat="mistral",
                needed="every layer slides when config.sliding_window is set",
            ),
            Architecture(
                "gemma2",
                "Gemma 2",
                sliding="layer_types",
                chat="gemma",
                needed="attention logit soft-capping (masklab.pretrained.hf applies it; load() picks eager over sdpa, "
                "which would drop it); alternating sliding layers",
            ),
            Architecture(
                "gemma3_text",
                "Gemma 3 (text)",
                sliding="layer_types",
                positions="rope-local-global",
                chat="gemma",
                needed="sliding layers with their own RoPE table; query scaling by query_pre_attn_scalar",
            ),
            Architecture(
                "phi3",
                "Phi-3",
                sliding="all",
                chat="phi3",
                needed="fused qkv projection (inside the attention module); sliding_window on every layer",
            ),
            Architecture("olmo2", "OLMo 2", chat="olmo2", needed="q/k norms inside the attention module"),
        )
    },
)


def _config(model_or_config):
    return getattr(model_or_config, "config", model_or_config)


def supported() -> str:
    """``"llama (Llama family ...), qwen2 (...), ..."``: the supported model types, for messages."""
    return ", ".join(f"{k} ({a.name})" for k, a in ARCHITECTURES.items())


def architecture(model_type: str | None) -> Architecture:
    """The table entry of a ``config.model_type``; one :class:`MasklabError` naming the
    supported types for any other."""
    if model_type not in ARCHITECTURES:
        raise MasklabError(f"model type {model_type!r} is not supported by masklab; supported: {supported()}")
    return ARCHITECTURES[model_type]


def arch_of(model_or_config) -> Architecture:
    """The table entry of a model or its config (by ``config.model_type``)."""
    return architecture(getattr(_config(model_or_config), "model_type", None))


def _path(obj, dotted: str, what: str, model: nn.Module):
    for part in dotted.split("."):
        if not hasattr(obj, part):
            raise MasklabError(f"cannot find the {what} of {type(model).__name__} (expected .{dotted})")
        obj = getattr(obj, part)
    return obj


def base_model(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (``model.model`` for Llama): takes ``input_ids``,
    ``position_ids``, ``attention_mask`` and returns ``last_hidden_state (B, T, D)``
    after the final norm."""
    return _path(model, arch_of(model).base, "decoder stack", model)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM, in order (the base model runs exactly these)."""
    a = arch_of(model)
    return _path(base_model(model), a.layers, "decoder layers", model)


def final_norm(model: nn.Module) -> nn.Module:
    """The norm the base model applies after its last decoder layer."""
    return _path(base_model(model), arch_of(model).norm, "final norm", model)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every decoder layer, in order."""
    a = arch_of(model)
    return [_path(layer, a.attention, "attention module", model) for layer in decoder_layers(model)]


def kv_heads(model_or_config) -> int:
    """Key/value heads per layer (``< num_attention_heads`` with grouped-query attention)."""
    cfg = _config(model_or_config)
    return int(getattr(cfg, arch_of(model_or_config).kv_heads, None) or cfg.num_attention_heads)


def sliding_window_layers(model_or_config) -> list[int]:
    """Indices of the layers that attend only to the last ``sliding_window`` keys."""
    a, cfg = arch_of(model_or_config), _config(model_or_config)
    n, window = int(cfg.num_hidden_layers), getattr(cfg, "sliding_window", None)
    if a.sliding == "none" or window is None:
        return []
    if a.sliding == "all":
        return list(range(n))
    return [i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention"]


LONG_ATTN = "masklab-causal"  # the first-layers pass's attention function (:func:`causal_attention`)


def causal_attention(
    module: nn.Module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
):
    """transformers attention function for one unpadded sequence read from its start (no
    cache, no padding): causal SDPA without a materialised mask, so PyTorch can use its
    fused kernels; a sliding layer (``sliding_window`` W, a key ``j`` visible to query
    ``i`` when ``i - W < j <= i``) attends block by block, each block of W queries against
    its 2W - 1 keys, so a long input costs ``O(T W)`` there, not ``O(T^2)``.

    query: ``(B, H, T, d)``; key, value: ``(B, Hkv, T, d)``. Returns ``((B, T, H, d), None)``.
    Registered as :data:`LONG_ATTN` without a mask builder, so transformers hands it no mask;
    :func:`first_layers` engages it only for models on ``sdpa`` attention."""
    import torch

    if attention_mask is not None:
        raise MasklabError("the first-layers pass reads one unpadded sequence; it got an attention mask")
    T = query.shape[-2]
    if key.shape[-2] != T:
        raise MasklabError("the first-layers pass reads a sequence from its start, without a cache")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped KV heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not sliding_window or T <= sliding_window:
        out = sdpa(query, key, value, is_causal=True, scale=scaling)
    else:
        W, parts = int(sliding_window), []
        for s in range(0, T, W):
            e, k0 = min(s + W, T), max(0, s - W + 1)
            i = torch.arange(s, e, device=query.device)[:, None]
            j = torch.arange(k0, e, device=query.device)[None, :]
            parts.append(
                sdpa(
                    query[..., s:e, :],
                    key[..., k0:e, :],
                    value[..., k0:e, :],
                    attn_mask=(j <= i) & (j > i - W),
                    scale=scaling,
                )
            )
        out = torch.cat(parts, dim=-2)
    return out.transpose(1, 2).contiguous(), None


def _fast_pass(model: nn.Module) -> bool:
    """Whether :func:`first_layers` may switch ``model`` to :func:`causal_attention`: on
    ``sdpa`` (eager stays for soft-capped logits, a prior's ``masklab`` function stays),
    causal (no bidirectional Gemma 3)."""
    cfg = model.config
    return (
        cfg._attn_implementation == "sdpa"
        and not getattr(cfg, "attn_logit_softcapping", None)
        and not getattr(cfg, "use_bidirectional_attention", False)
    )


@contextlib.contextmanager
def first_layers(model: nn.Module, k: int) -> Iterator[nn.Module]:
    """While the block runs, the base model (:func:`base_model`) has only its first ``k``
    decoder layers (its final norm still applies): ``base(input_ids=ids).last_hidden_state``
    is then ``final_norm(state after layer k)``, ``(B, T, D)``. Yields the base model.

    A model on ``sdpa`` attention runs :func:`causal_attention` meanwhile (the same
    attention, without the ``(T, T)`` masks transformers would build: linear in a sliding
    layer's window), so the block must read unpadded sequences from their start."""
    a, base = arch_of(model), base_model(model)
    layers, n = decoder_layers(model), base.config.num_hidden_layers
    if not 1 <= k <= n:
        raise MasklabError(f"the router reads 1..{n} layers of this model, got {k}")
    fast = _fast_pass(model)
    if fast:
        from transformers import AttentionInterface

        AttentionInterface.register(LONG_ATTN, causal_attention)
        model.set_attn_implementation(LONG_ATTN)
    setattr(base, a.layers, layers[:k])
    base.config.num_hidden_layers = k
    try:
        yield base
    finally:
        setattr(base, a.layers, layers)
        base.config.num_hidden_layers = n
        if fast:
            model.set_attn_implementation("sdpa")
