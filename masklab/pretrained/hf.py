"""Mask priors and per-layer/per-head interventions on Hugging Face causal LMs.

masklab's attention convention (:mod:`masklab.priors.attention`) is ``logits = q k^T * scale +
prior + bias``. This module brings it to a pretrained ``transformers`` model through the
library's own extension points, without touching the model's code:

* an attention function ``"masklab"`` registered with ``transformers.AttentionInterface``
  (same signature and argument order as transformers' SDPA function, so wrappers such as
  kvpress's that pass ``dropout`` positionally keep working), and
* the same name registered with ``AttentionMaskInterface`` as SDPA's mask builder with the
  ``is_causal`` shortcut turned off, so the causal / sliding-window / padding mask is built
  exactly as for ``sdpa`` and always reaches the function as a ``(B, 1, Tq, Tk)`` tensor.

The function adds, per query head, the attached prior for the current queries against
all keys and an optional hiding bias, then calls SDPA with the summed float mask.

Positions: with a KV cache the current queries are absolute positions ``[q0, q0 + Tq)``
(``q0 = cache_position[0]``, read by a forward pre-hook) and the keys handed to the
function are the most recent ``Tk`` positions ``[q0 + Tq - Tk, q0 + Tq)`` (a full layer of a
dynamic cache: all of them; a sliding layer of Gemma 3: only the window). The prior is
asked for ``prior(Tq, q0 + Tq, q0)`` and cropped to the last ``Tk`` key columns, so it sees
absolute positions in every layer. A static cache (keys = slots ``[0, Tk)`` with
``Tk >= q0 + Tq``) is read as keys ``[0, Tk)``. After a kvpress press has pruned keys, kept
keys are treated as the most recent ones (a press removes the positions this would need).

Supported architectures: :data:`masklab.pretrained.arch.ARCHITECTURES` (by
``model.config.model_type``), which also says where each model keeps its layers.

Attention logit soft-capping (Gemma 2: ``softcap`` handed to the attention function) is
applied as the model's eager attention does, ``softcap * tanh(q k^T * scale / softcap)``,
before the mask, prior and hiding bias are added.

API: :func:`attach_priors`, :func:`detach_priors`, :func:`save_priors`,
:func:`load_priors`, :func:`hide`, :func:`priors_of`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from masklab.priors.bias import MaskPrior, RecencyPrior, RelativePrior
from masklab.pretrained.arch import attention_modules
from masklab.util.errors import MasklabError

ATTN_NAME = "masklab"
FILE_FORMAT = "masklab-priors"
FILE_VERSION = "1"
PRIOR_TYPES: dict[str, type[nn.Module]] = {
    "RelativePrior": RelativePrior,
    "RecencyPrior": RecencyPrior,
    "MaskPrior": MaskPrior,
}

PriorFactory = Callable[[int, int], nn.Module]


# --------------------------------------------------------------------------- the attention function
def _key_start(module: nn.Module, q_len: int, k_len: int) -> tuple[int, int]:
    """``(q0, s)``: absolute position of the first query and of the first key handed in."""
    q0 = getattr(module, "_masklab_q0", None)
    if q0 is None:  # no cache_position seen: local frame, keys end at the last query
        return k_len - q_len, 0
    return q0, max(q0 + q_len - k_len, 0)


def masklab_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """transformers attention function: SDPA on ``mask + prior + hide``.

    query: ``(B, H, Tq, d)``; key, value: ``(B, Hkv, Tk, d)`` (``H`` a multiple of ``Hkv``);
    attention_mask: ``(B, 1, Tq, >=Tk)`` bool (True = visible) or additive float, or None
    (then causal, the queries being the last ``Tq`` keys). Returns ``((B, Tq, H, d), probs)``
    with ``probs (B, H, Tq, Tk)`` only while ``output_attentions`` was requested.
    softcap: cap the logits as ``softcap * tanh(logits / softcap)`` before the mask is added
    (computed explicitly: SDPA cannot).
    """
    B, H, Tq, _ = query.shape
    Tk = key.shape[-2]
    groups = H // key.shape[1]
    if groups > 1:  # grouped KV heads: priors are per query head
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    dtype, dev = query.dtype, query.device
    if attention_mask is None:
        visible = torch.ones(Tq, Tk, dtype=torch.bool, device=dev).tril(Tk - Tq)[None, None]
        mask = torch.zeros(visible.shape, dtype=dtype, device=dev).masked_fill(~visible, float("-inf"))
    else:
        mask = attention_mask[..., :Tk]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=dtype, device=dev).masked_fill(~mask, float("-inf"))
        else:
            mask = mask.to(dtype)
    q0, s = _key_start(module, Tq, Tk)
    prior = module._modules.get("prior")
    if prior is not None:
        mask = mask + _prior_bias(prior, H, Tq, s + Tk, q0)[..., s:].to(dtype)[None]  # (1, H, Tq, Tk)
    hidden = getattr(module, "_masklab_hide", None)
    if hidden is not None:
        mask = mask + _hide_bias(hidden, B, H, s, Tk, dtype, dev)  # (B|1, H|1, 1, Tk)
    dead = torch.isneginf(mask).all(-1, keepdim=True)  # a query with no visible key (padding)
    if dead.any():
        mask = mask.masked_fill(dead, 0.0)
    if getattr(module, "_masklab_probs", False) or softcap is not None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        logits = (query @ key.transpose(-2, -1)) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        probs = (logits + mask).softmax(-1)
        probs = nn.functional.dropout(probs, p=dropout, training=module.training)
        keep = getattr(module, "_masklab_probs", False)
        return (probs @ value).transpose(1, 2).contiguous(), probs if keep else None
    out = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


def _prior_bias(prior: nn.Module, H: int, Tq: int, Tk: int, q0: int) -> Tensor:
    """``prior(Tq, Tk, q0)``, refused unless it is the ``(H|1, Tq, Tk)`` bias a prior must give
    (a wrong shape would otherwise be broadcast silently)."""
    bias = prior(Tq, Tk, q0)
    if (
        not isinstance(bias, Tensor)
        or bias.dim() != 3
        or bias.shape[0] not in (1, H)
        or tuple(bias.shape[1:]) != (Tq, Tk)
    ):
        got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise MasklabError(
            f"the prior {type(prior).__name__} returned shape {got}; expected ({H} or 1, {Tq}, {Tk}) "
            f"= (heads, queries, keys) for {Tq} queries from position {q0}"
        )
    return bias


def _hide_bias(
    hidden: tuple[Tensor, list[int] | None], B: int, H: int, s: int, Tk: int, dtype: torch.dtype, dev: torch.device
) -> Tensor:
    """``(B|1, H|1, 1, Tk)`` bias: ``-inf`` on hidden keys (absolute positions ``[s, s + Tk)``)."""
    keep, heads = hidden  # keep: (B|1, T) bool over absolute positions; beyond T = visible
    if s == 0 and keep.shape[-1] > Tk and not keep[:, Tk:].all():  # the whole sequence is here: nothing may lie past it
        last = int((~keep).nonzero()[:, 1].max()) + 1
        raise MasklabError(
            f"hide: the hidden positions reach {last} but the sequence has {Tk} tokens "
            f"(spans are token positions [start, end) with end <= {Tk})"
        )
    cols = keep[:, s : s + Tk].to(dev)
    if cols.shape[-1] < Tk:
        pad = torch.ones(cols.shape[0], Tk - cols.shape[-1], dtype=torch.bool, device=dev)
        cols = torch.cat([cols, pad], dim=-1)
    if cols.shape[0] not in (1, B):
        raise MasklabError(f"hide: keep has {cols.shape[0]} rows but the batch has {B} sequences")
    bias = torch.zeros(cols.shape, dtype=dtype, device=dev).masked_fill(~cols, float("-inf"))[:, None, None, :]
    if heads is None:
        return bias
    on = torch.zeros(H, dtype=torch.bool, device=dev)
    on[heads] = True
    return torch.where(on[None, :, None, None], bias, torch.zeros((), dtype=dtype, device=dev))


def _masklab_mask(*args, **kwargs):
    """SDPA's mask builder that always materialises the mask (never the ``is_causal`` shortcut)."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, masklab_attention)
    AttentionMaskInterface.register(ATTN_NAME, _masklab_mask)


# --------------------------------------------------------------------------- model plumbing
def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every decoder layer, in order (read from the
    architecture table, :mod:`masklab.pretrained.arch`; an unsupported type is one error)."""
    return attention_modules(model)


def _q0_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
    cp = kwargs.get("cache_position")
    module._masklab_q0 = int(cp[0]) if cp is not None and cp.numel() else None


def _probs_hook(model: nn.Module, args: tuple, kwargs: dict) -> None:
    want = bool(kwargs.get("output_attentions") or getattr(model.config, "output_attentions", False))
    for attn in model._masklab_layers:
        attn._masklab_probs = want


def _engage(model: nn.Module) -> None:
    """Switch ``model`` to the masklab attention function (idempotent; counted)."""
    layers = attention_layers(model)
    if getattr(model, "_masklab_users", 0) == 0:
        _register()
        model._masklab_prev_attn = model.config._attn_implementation
        model._masklab_layers = layers
        hooks = [a.register_forward_pre_hook(_q0_hook, with_kwargs=True) for a in layers]
        hooks.append(model.register_forward_pre_hook(_probs_hook, with_kwargs=True))
        model._masklab_hooks = hooks
        model.set_attn_implementation(ATTN_NAME)
    model._masklab_users = getattr(model, "_masklab_users", 0) + 1


def _disengage(model: nn.Module) -> None:
    model._masklab_users -= 1
    if model._masklab_users > 0:
        return
    for h in model._masklab_hooks:
        h.remove()
    for a in model._masklab_layers:
        for name in ("_masklab_q0", "_masklab_probs"):
            a.__dict__.pop(name, None)
    model.set_attn_implementation(model._masklab_prev_attn)
    for name in ("_masklab_users", "_masklab_prev_attn", "_masklab_layers", "_masklab_hooks"):
        model.__dict__.pop(name, None)


# --------------------------------------------------------------------------- priors
def attach_priors(model: nn.Module, factory: PriorFactory) -> list[nn.Module]:
    """Give every attention layer a prior ``factory(layer_idx, n_heads)``.

    The prior is called as ``prior(Tq, Tk, offset)`` and must return an ``(H|1, Tq, Tk)``
    bias (queries ``[offset, offset + Tq)`` against keys ``[0, Tk)``). It becomes the
    submodule ``prior`` of the layer's attention module (``self_attn``; parameter names
    contain ``prior``), placed on the layer's device. Returns the priors, one per layer.
    """
    layers = attention_layers(model)
    if priors_of(model):
        raise MasklabError("this model already has priors attached; call detach_priors(model) first")
    heads = int(model.config.num_attention_heads)
    ref = next(model.parameters())
    priors = []
    for i in range(len(layers)):  # build all first: a failing factory leaves the model untouched
        p = factory(i, heads)
        if not isinstance(p, nn.Module):
            raise MasklabError(f"the prior factory returned {type(p).__name__} for layer {i}, not an nn.Module")
        with torch.no_grad():  # a prior for another head count fails here, not in the first forward pass
            probe = p(2, 2, 0)
        if not isinstance(probe, Tensor) or probe.dim() != 3 or probe.shape[0] not in (1, heads):
            got = tuple(probe.shape) if isinstance(probe, Tensor) else type(probe).__name__
            raise MasklabError(
                f"the prior factory's prior for layer {i} gives shape {got} for 2 queries x 2 keys; "
                f"expected ({heads} or 1, 2, 2): the model has {heads} attention heads"
            )
        priors.append(p.to(device=ref.device))
    for attn, p in zip(layers, priors):
        attn.add_module("prior", p)
    _engage(model)
    return priors


def priors_of(model: nn.Module) -> list[nn.Module]:
    """The attached priors, one per layer (empty when none are attached)."""
    found = [a._modules.get("prior") for a in attention_layers(model)]
    return [p for p in found if p is not None]


def detach_priors(model: nn.Module) -> None:
    """Remove the attached priors and restore the model's attention implementation."""
    layers = attention_layers(model)
    if not priors_of(model):
        raise MasklabError("this model has no priors attached")
    for attn in layers:
        del attn._modules["prior"]
    _disengage(model)


def _prior_config(p: nn.Module) -> dict:
    if isinstance(p, (RelativePrior, RecencyPrior)):
        return p.config()
    if isinstance(p, MaskPrior):
        return {"heads": int(p.m.shape[0]), "size": int(p.m.shape[-1]), "mode": p.mode}
    raise MasklabError(f"cannot save a prior of type {type(p).__name__}; savable: {', '.join(PRIOR_TYPES)}")


def _build_prior(kind: str, cfg: dict) -> nn.Module:
    if kind in ("RelativePrior", "RecencyPrior"):
        return PRIOR_TYPES[kind](**cfg)
    size, heads = int(cfg["size"]), int(cfg["heads"])
    return MaskPrior(torch.ones(heads, size, size), mode=cfg["mode"])  # tensors come from the file


def _model_meta(model: nn.Module) -> dict:
    c = model.config
    return {
        "model_type": c.model_type,
        "model_name": Path(str(getattr(c, "_name_or_path", "") or "")).name,
        "n_layers": int(c.num_hidden_layers),
        "heads": int(c.num_attention_heads),
        "hidden_size": int(c.hidden_size),
    }


def save_priors(model: nn.Module, path: str | Path) -> Path:
    """Write the attached priors to a safetensors file (tensors ``layers.{i}.{name}``)
    with metadata: format, model type/name, layers, heads, prior type and its arguments."""
    from safetensors.torch import save_file

    priors = priors_of(model)
    if not priors:
        raise MasklabError("this model has no priors attached; nothing to save")
    kinds = {type(p).__name__ for p in priors}
    if len(kinds) != 1:
        raise MasklabError(f"all layers must carry the same prior type to be saved, got {sorted(kinds)}")
    tensors = {
        f"layers.{i}.{k}": v.detach().cpu().contiguous()
        for i, p in enumerate(priors)
        for k, v in p.state_dict().items()
    }
    meta = {
        "format": FILE_FORMAT,
        "version": FILE_VERSION,
        **{k: str(v) for k, v in _model_meta(model).items()},
        "prior_type": kinds.pop(),
        "prior_args": json.dumps([_prior_config(p) for p in priors]),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    return path


def load_priors(model: nn.Module, path: str | Path, check_name: bool = True) -> list[nn.Module]:
    """Attach the priors stored in ``path`` (replacing attached ones).

    Errors (``MasklabError``) for a file that is not a masklab priors file, or one made for
    another model type, layer count, head count or width, or (``check_name``) another model
    name, and for tensors whose shapes do not match the recorded prior arguments.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise MasklabError(f"priors file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise MasklabError(f"{path} is not a safetensors file ({e})") from None
    if meta.get("format") != FILE_FORMAT:
        raise MasklabError(f"{path} is not a masklab priors file (no format={FILE_FORMAT!r} in its metadata)")
    if meta.get("version") != FILE_VERSION:
        raise MasklabError(f"{path}: priors file version {meta.get('version')!r}, this masklab reads {FILE_VERSION}")
    want = _model_meta(model)
    keys = ["model_type", "n_layers", "heads", "hidden_size"] + (["model_name"] if check_name else [])
    bad = [f"{k}: file {meta.get(k)!r}, model {str(want[k])!r}" for k in keys if meta.get(k) != str(want[k])]
    if bad:
        raise MasklabError(f"{path} does not fit this model ({'; '.join(bad)})")
    kind = meta.get("prior_type")
    if kind not in PRIOR_TYPES:
        raise MasklabError(f"{path}: unknown prior type {kind!r}; known: {', '.join(PRIOR_TYPES)}")
    try:
        cfgs = json.loads(meta["prior_args"])
        built = [_build_prior(kind, c) for c in cfgs]
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise MasklabError(f"{path}: bad prior arguments in the metadata ({e})") from None
    if len(built) != want["n_layers"]:
        raise MasklabError(f"{path}: {len(built)} priors for a model with {want['n_layers']} layers")
    for i, p in enumerate(built):
        sd = p.state_dict()
        got = {k[len(f"layers.{i}.") :]: v for k, v in tensors.items() if k.startswith(f"layers.{i}.")}
        if set(got) != set(sd):
            raise MasklabError(f"{path}: layer {i} has tensors {sorted(got)}, expected {sorted(sd)}")
        for k, v in got.items():
            if v.shape != sd[k].shape or v.dtype != sd[k].dtype:
                raise MasklabError(
                    f"{path}: layer {i} tensor {k!r} is {tuple(v.shape)} {v.dtype}, "
                    f"expected {tuple(sd[k].shape)} {sd[k].dtype}"
                )
        p.load_state_dict(got)
    if priors_of(model):
        detach_priors(model)
    return attach_priors(model, lambda i, heads: built[i])


# --------------------------------------------------------------------------- interventions
@contextlib.contextmanager
def hide(
    model: nn.Module,
    spans: Sequence[tuple[int, int]] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    keep: Tensor | None = None,
) -> Iterator[None]:
    """Hide tokens' keys (``-inf`` logits) in chosen layers and heads while the block runs.

    spans: token positions ``[start, end)`` hidden in every sequence of the batch; or
    keep: ``(B|1, T)`` bool, True = visible (one row per sequence: a batch of variants).
    layers / heads: indices (None = all). Positions past ``T`` (e.g. generated tokens)
    stay visible. With ``layers=None, heads=None`` this equals zeroing those tokens in the
    2-D ``attention_mask`` (tested).
    """
    if (spans is None) == (keep is None):
        raise MasklabError("hide: give exactly one of spans=[(start, end), ...] or keep=(B, T) bool")
    all_layers = attention_layers(model)
    n_layers, n_heads = len(all_layers), int(model.config.num_attention_heads)
    if keep is None:
        end = max([e for _, e in spans] + [0])
        keep = torch.ones(1, end, dtype=torch.bool)
        for a, b in spans:
            if not 0 <= a <= b:
                raise MasklabError(f"hide: bad span ({a}, {b}); need 0 <= start <= end")
            keep[:, a:b] = False
    elif keep.dtype != torch.bool or keep.dim() != 2:
        raise MasklabError(f"hide: keep must be a (B, T) bool tensor, got {tuple(keep.shape)} {keep.dtype}")
    chosen = list(range(n_layers)) if layers is None else list(layers)
    if any(not 0 <= i < n_layers for i in chosen):
        raise MasklabError(f"hide: layers must lie in [0, {n_layers}), got {list(layers)}")
    head_list = None if heads is None else list(heads)
    if head_list is not None and any(not 0 <= h < n_heads for h in head_list):
        raise MasklabError(f"hide: heads must lie in [0, {n_heads}), got {head_list}")
    _engage(model)
    try:
        for i in chosen:
            all_layers[i]._masklab_hide = (keep, head_list)
        yield
    finally:
        for i in chosen:
            all_layers[i].__dict__.pop("_masklab_hide", None)
        _disengage(model)
