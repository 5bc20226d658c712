"""The one model loader: a checkpoint into transformers, gated family registered, errors as one line.

Before any weight is read, the config is built with transformers' `AutoConfig` (the step vLLM takes too)
and the tensor shapes the safetensors headers give are compared with those of the model the config
describes, built on the meta device (no memory). A mismatch would otherwise make transformers print a
load report and raise, far from the cause.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.checkpoint.classes import known_model_type
from longctx.checkpoint.text_config import built_text_config
from longctx.checkpoint.weights import safetensors_shapes
from longctx.core.errors import InputError, SettingError, exception_line, ref
from longctx.core.files import json_object
from longctx.core.kinds import Bool
from longctx.core.settings import setting

TRUST_REMOTE_CODE_HELP = ("Run the Python code a checkpoint ships (config.json auto_map) to build its config, "
                          "model or tokenizer; read that code first. Off: such a checkpoint is refused.")


def trust_remote_code_setting() -> Any:
    """The `trust_remote_code` setting every verb that builds a model, config or tokenizer has (off by default,
    as in transformers and vLLM; recorded with the verb's other settings)."""
    return setting(False, Bool(), TRUST_REMOTE_CODE_HELP)


def remote_code(auto_map: Any, known: bool) -> str | None:
    """The classes a config's or tokenizer config's `auto_map` names when transformers would need them (the
    model or tokenizer type is not one it has: `known` false), as 'AutoConfig: configuration_x.XConfig, ...'."""
    if known or not isinstance(auto_map, dict) or not auto_map:
        return None
    return ", ".join(f"{k}: {v if isinstance(v, str) else '/'.join(map(str, v))}" for k, v in auto_map.items())


def check_remote_code(path: str | os.PathLike, what: str, classes: str | None, trust: bool) -> None:
    """InputError unless `trust` when building `what` (config, tokenizer) of checkpoint `path` runs the code
    `classes` names (transformers would raise a multi-line ValueError, or prompt on a terminal)."""
    if classes is not None and not trust:
        raise SettingError(f"'{path}' needs its own Python code to build its {what} ({classes}); longctx runs it "
                           f"only with {ref('trust_remote_code')}: read that code first")


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """Within it transformers logs errors only and Python warnings are not shown: what it says while it builds a
    config, or a model on the meta device (keys it does not know that vLLM reads, token ids, defaults it fills
    in) would repeat at every load, or come before a refusal that longctx words itself; nor is its progress bar
    (a meta-device load reads no weights)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def model_config(path: str | os.PathLike, config: dict[str, Any] | None = None, trust_remote_code: bool = False):
    """The transformers config object of checkpoint `path` (of the config.json dict `config` when given), or
    InputError with transformers' reason in one line; code the checkpoint ships runs only with
    `trust_remote_code`."""
    from transformers import AutoConfig

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    source = Path(path) / "config.json"
    if config is not None:
        from transformers import PreTrainedConfig

        # transformers writes an infinite or NaN float as {"__float__": "Infinity"} and decodes it when it reads a
        # file (configuration_utils.py `_decode_special_floats`, e.g. Mamba hybrids' time_step_limit); a dict
        # read from such a file is decoded the same way
        config = PreTrainedConfig._decode_special_floats(config)
    raw = json_object(source) if config is None else config  # {}: transformers says what is wrong with the file
    if isinstance(raw, dict):
        classes = remote_code(raw.get("auto_map"), known_model_type(raw.get("model_type")))
        check_remote_code(path, "config", classes, trust_remote_code)
    try:
        with transformers_quiet():
            if config is None or trust_remote_code:
                built = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
                if config is None:
                    return built
                # `config` built by the checkpoint's own config class, which still knows where its code is
                # (the model class of auto_map is looked up in `_name_or_path`)
                override = type(built).from_dict(dict(config))
                override._name_or_path = built._name_or_path
                return override
            return AutoConfig.for_model(config.get("model_type"), **{k: v for k, v in config.items()
                                                                      if k != "model_type"})
    # Building a config reads only the JSON, so whatever goes wrong is the file's (transformers raises
    # ValueError, KeyError, TypeError, and huggingface_hub's StrictDataclassError for a field of the wrong type).
    except Exception as e:  # noqa: BLE001
        raise InputError(f"'{source}': transformers cannot build a config from it ({exception_line(e)}); fix "
                         "config.json or restore it from the original checkpoint") from None


def sliding_window(config: Any) -> dict[str, int] | None:
    """Where the transformers `config`'s layers attend to the last `window` tokens only, as
    {"window", "layers" (how many do), "of" (layers in all)}; None when every layer sees the whole sequence.

    transformers 5 normalises the families' own keys into `sliding_window` + `layer_types` (Qwen2/Qwen3 clear
    the window when use_sliding_window is false; Gemma-2/3 alternate layer types); a config with a window but
    no layer types (Mistral) applies it to every layer, as transformers and vLLM do. Of a composite config: its
    language model's.
    """
    config = built_text_config(config)
    window = getattr(config, "sliding_window", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or not isinstance(layers, int):
        return None
    types = getattr(config, "layer_types", None)
    sliding = sum(t == "sliding_attention" for t in types) if types else layers
    return {"window": window, "layers": sliding, "of": layers} if sliding else None


def text_generation_class(config: Any) -> Any:
    """The transformers Auto class that builds the model generating text of `config` from text alone:
    AutoModelForCausalLM where it has the config's class (or the config's own code names one), else, for a
    composite model it has no causal LM for (Mistral-3, Qwen2.5-VL: their language model nested in
    `text_config`), AutoModelForImageTextToText, whose models take text without images; None when neither."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    )

    auto_map = getattr(config, "auto_map", None) or {}
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or "AutoModelForCausalLM" in auto_map:
        return AutoModelForCausalLM
    if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING or "AutoModelForImageTextToText" in auto_map:
        return AutoModelForImageTextToText
    return None


def _generation_class(path: str | os.PathLike, config: Any) -> Any:
    """`text_generation_class(config)`, or InputError naming checkpoint `path` when transformers has none."""
    auto = text_generation_class(config)
    if auto is None:
        raise InputError(f"checkpoint '{path}': transformers has no model that generates text for its "
                         f"{type(config).__name__} (no causal LM, no image-text-to-text model)")
    return auto


def check_weight_shapes(path: str | os.PathLike, config: Any, trust_remote_code: bool = False) -> None:
    """InputError naming the first tensor whose shape in the checkpoint's safetensors headers differs from the
    model that the transformers `config` describes (tensors only one side has are not compared)."""
    import torch

    stored = safetensors_shapes(path)
    if not stored:
        return
    auto = _generation_class(path, config)
    try:
        with torch.device("meta"), transformers_quiet():
            model = auto.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as e:
        raise InputError(f"checkpoint '{path}': transformers has no causal LM for this config ({exception_line(e)})"
                         ) from None
    for name, tensor in model.state_dict().items():
        shape = stored.get(name)
        if shape is not None and shape != tuple(tensor.shape):
            raise InputError(f"checkpoint '{path}': tensor '{name}' has shape {list(shape)} in the weight files but "
                             f"{list(tensor.shape)} in the model config.json describes; the weights and config.json "
                             "are from different models")
    _check_weight_names(path, auto, config, trust_remote_code)


def _check_weight_names(path: str | os.PathLike, auto: Any, config: Any, trust_remote_code: bool) -> None:
    """InputError when the weight files lack a tensor the model `config` describes needs, or hold one it has no
    place for. transformers decides, as it loads (on the meta device: names only, no tensor is read): its
    loading report knows tied weights, buffers, the keys a class may lack or ignore, and the renamings and
    fusions between a checkpoint's names and the model's (`from_pretrained(output_loading_info=True)`)."""
    try:
        with transformers_quiet():
            _, info = auto.from_pretrained(path, config=config, device_map="meta", output_loading_info=True,
                                           trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise InputError(f"cannot load the model in '{path}': {exception_line(e)}") from None
    for key, words in (("missing_keys", "lack {n} tensor{s} the model config.json describes needs"),
                       ("unexpected_keys", "hold {n} tensor{s} the model config.json describes has no place for")):
        names = sorted(info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f", ... ({len(names) - 3} more)" if len(names) > 3 else "")
            what = words.format(n=len(names), s="s" * (len(names) > 1))
            raise InputError(f"checkpoint '{path}': the weight files {what} ({shown}); the weights and config.json "
                             "are from different models: use the config.json saved with these weights")


def load_model(path: str | os.PathLike, *, dtype: Any = "auto", device: str | None = None,
               attn_implementation: str | None = None, config: dict[str, Any] | None = None,
               trust_remote_code: bool = False):
    """`AutoModelForCausalLM.from_pretrained(path)` (`text_generation_class`: of a composite model without one,
    AutoModelForImageTextToText) in `dtype` ("auto": the checkpoint's; a name such as "float32"; or a torch
    dtype) on `device`, with `attn_implementation` [default: transformers'], with `config` (a config.json dict)
    instead of the checkpoint's own when given, running the code the checkpoint ships only with
    `trust_remote_code`."""
    import torch

    check_device(device)
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    built = model_config(path, config, trust_remote_code)
    check_weight_shapes(path, built, trust_remote_code)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if config is not None:
        kwargs["config"] = built
    try:
        model = _generation_class(path, built).from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot load the model in '{path}': {exception_line(e)}") from None
    return model.to(device) if device is not None else model


def check_device(device: str | None) -> None:
    """SettingError (about the setting `device`) unless torch can place a model on `device` here (None: the
    caller's default, always fine)."""
    if device is None:
        return
    import torch

    flag = ref("device")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise SettingError(f"{flag} {device}: not a torch device; use cpu, cuda or cuda:N") from None
    if d.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SettingError(f"{flag} {device}: torch sees no CUDA device here; use {flag} cpu")
        if d.index is not None and d.index >= count:
            raise SettingError(f"{flag} {device}: torch sees {count} CUDA device(s) here "
                               f"(cuda:0 to cuda:{count - 1})")
    elif d.type != "cpu":
        # mps, xpu, ...: torch.<type>.is_available() or torch.backends.<type>.is_available(), where torch has one
        module = getattr(torch, d.type, None)
        available = getattr(module, "is_available", None) or getattr(getattr(torch.backends, d.type, None),
                                                                      "is_available", None)
        if available is not None and not available():
            raise SettingError(f"{flag} {device}: torch sees no {d.type} device here; use {flag} cpu")
