"""Convert a llama.cpp GGUF file into a transformers checkpoint (safetensors, tokenizer with its chat template,
generation config), through transformers' own GGUF loader: what `from_pretrained(folder, gguf_file=...)` builds is
what is written, its weights de-quantized to float32 (transformers docs, "GGUF and interaction with Transformers";
the formats: github.com/ggml-org/ggml docs/gguf.md). The file's sha256, architecture, name and the quantization
of its tensors go to `longctx.json`.

transformers cannot save the model it loaded from a GGUF file (it keeps the file's quantization config), so the
state dict is moved into a model built from the same config without it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import write_provenance
from longctx.convert.result import ConvertResult
from longctx.convert.settings import ConvertSettings
from longctx.core.errors import InputError, SettingError, exception_line, ref
from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output
from longctx.core.hashing import sha256_file
from longctx.rope.config import check_written_rope, read_rope

SUFFIX = ".gguf"
INSTALL = "reading GGUF files needs the gguf package: pip install 'longctx[gguf]'"


def gguf_file(source: str) -> Path:
    """The GGUF file `source` names: the file, or the one `.gguf` file in a folder; InputError otherwise."""
    path = Path(source)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix == SUFFIX and p.is_file())
        if len(found) != 1:
            what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(p.name for p in found)})"
            raise InputError(f"'{source}' holds {what}; give the GGUF file itself")
        return found[0]
    if not path.is_file():
        raise InputError(f"GGUF file '{source}' does not exist")
    if path.suffix != SUFFIX:
        raise SettingError(f"'{source}' is not a .gguf file; {ref('layout')} gguf converts a llama.cpp GGUF file",
                           ConvertSettings)
    return path


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise InputError(INSTALL) from None
    try:
        return GGUFReader(path)
    except (ValueError, OSError, KeyError, IndexError) as e:  # a torn or foreign file
        raise InputError(f"cannot read '{path}' as GGUF: {exception_line(e)}") from None


def _field(reader, key: str) -> Any:
    """A scalar or string field of the GGUF header, or None."""
    field = reader.get_field(key)
    if field is None or not field.types:
        return None
    return field.contents()


def describe_gguf(path: Path) -> dict[str, Any]:
    """What the header says: architecture, model name, file type, and how many tensors each quantization has."""
    reader = _reader(path)
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return {"architecture": _field(reader, "general.architecture"), "name": _field(reader, "general.name"),
            "file_type": _field(reader, "general.file_type"), "tensors": len(reader.tensors),
            "quantization": dict(sorted(types.items()))}


def trained_length(source: str) -> int | None:
    """The context length the GGUF file's header gives (`<architecture>.context_length`), None if unreadable."""
    try:
        reader = _reader(gguf_file(source))
    except InputError:
        return None
    value = _field(reader, f"{_field(reader, 'general.architecture')}.context_length")
    return int(value) if isinstance(value, int) else None


def _check_supported(path: Path, header: dict[str, Any]) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = header["architecture"]
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise InputError(f"'{path.name}' is a GGUF file of architecture {arch!r}, which transformers cannot load "
                         f"from GGUF; it loads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}")


def _check_dequantizable(path: Path, header: dict[str, Any]) -> None:
    """Refuse a file with tensors of a type the gguf package cannot de-quantize, before anything is loaded."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    missing = []
    for name in header["quantization"]:
        qtype = GGMLQuantizationType[name]
        size = GGML_QUANT_SIZES[qtype][1]  # bytes of one block
        try:
            quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        except NotImplementedError:
            missing.append(name)
    if missing:
        raise InputError(f"'{path.name}' has tensors in {', '.join(missing)}, which the gguf package cannot "
                         "de-quantize; convert a file in F32, F16, BF16 or a Q*_0/Q*_1/Q*_K/IQ* quantization")


def _load(path: Path):
    """(config, tokenizer, model) as transformers builds them from the GGUF file, the model in float32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except NotImplementedError as e:  # gguf has no de-quantization for one of its tensor types
        raise InputError(f"cannot de-quantize '{path.name}': {exception_line(e)}") from None
    except (ValueError, KeyError, OSError, TypeError) as e:
        raise InputError(f"transformers cannot load '{path.name}': {exception_line(e)}") from None
    return config, tokenizer, model


def _plain_model(config, loaded):
    """A model of `loaded`'s class and weights, from `config` without the file's quantization config, which is
    what transformers refuses to save."""
    import torch

    values = {k: v for k, v in config.to_dict().items() if k not in ("quantization_config", "_name_or_path",
                                                                     "_model_name_or_path")}
    plain_config = type(config).from_dict({**values, "architectures": [type(loaded).__name__],
                                           "dtype": "float32"})
    with torch.device("meta"):
        model = type(loaded)(plain_config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    return model


def convert(s: ConvertSettings) -> ConvertResult:
    """Convert the GGUF file `s.source` into a float32 transformers checkpoint at `s.output`."""
    from transformers import GenerationConfig

    path = gguf_file(s.source)
    header = describe_gguf(path)
    _check_supported(path, header)
    _check_dequantizable(path, header)
    out = Path(s.output)
    check_output(out, CHECKPOINT_KIND, inputs=[("GGUF file", path)], overwrite=s.overwrite)
    config, tokenizer, loaded = _load(path)
    model = _plain_model(config, loaded)
    cfg = model.config.to_dict()
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                         pad_token_id=model.config.pad_token_id).save_pretrained(tmp)
        check_written_rope(tmp, read_rope(cfg))  # transformers reads back the RoPE the file gave
        write_provenance(tmp, "convert", {"from": s.layout, "gguf": {"file": str(path.resolve()),
                                                                     "sha256": sha256_file(path), **header}}, None)
    return ConvertResult(out, path, "baseline", type(model).__name__, sum(p.numel() for p in model.parameters()),
                         model.config.num_attention_heads // (model.config.num_key_value_heads
                                                             or model.config.num_attention_heads))
