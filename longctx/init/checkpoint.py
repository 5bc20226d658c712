"""`longctx init OUT --preset tiny --attention elementwise`: a freshly initialised checkpoint.

Writes config, safetensors, tokenizer, generation config and `longctx.json` for a preset and an attention
variant; baselines are plain `Qwen3ForCausalLM`, so vLLM runs them on its native path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longctx.checkpoint.directory import copy_side_files, is_tokenizer_file, write_provenance
from longctx.checkpoint.hub import hub_origin, resolve_checkpoint
from longctx.checkpoint.paths import code_modules
from longctx.checkpoint.tokenizer import (
    check_tokenizer_source,
    load_tokenizer,
    require_tokenizer_files,
    write_reference_tokenizer,
)
from longctx.core.errors import ref
from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output, json_object
from longctx.init.bpe import train_bpe_tokenizer
from longctx.init.presets import PRESET_DTYPES, PRESETS, model_config, parameter_count
from longctx.init.settings import TOKENIZER_CHOICES, InitSettings
from longctx.rope.config import check_written_rope
from longctx.rope.layers import asked_rope


@dataclass(frozen=True)
class InitResult:
    output: Path
    architecture: str
    attention: str
    preset: str
    dtype: str
    parameters: int
    baseline_parameters: int  # the baseline's at this preset and vocabulary (what match_params matches)
    intermediate_size: int
    vocab_size: int


def _write_tokenizer(s: InitSettings, source: Path | None, out: Path):
    """Write the tokenizer `s.tokenizer` asks for (from the folder `source` when it names one) into `out`;
    return it loaded."""

    if s.tokenizer == "reference":
        write_reference_tokenizer(out)
    elif s.tokenizer == "bpe":
        corpus = Path(s.bpe_corpus).read_text(encoding="utf-8").splitlines() if s.bpe_corpus else None
        # One token per digit, as Qwen's tokenizer: a number reads the same wherever it stands
        # (checkpoints/README.md has what coarser digit tokens did to the tiny models).
        train_bpe_tokenizer(out, s.vocab_size, corpus, digit_group=1, bos=s.bpe_bos)
    else:
        # with --trust-remote-code the code its auto_map names travels with it (top-level modules, as transformers
        # writes them: dynamic_module_utils.custom_object_save)
        code = s.trust_remote_code and bool(code_modules(json_object(source / "tokenizer_config.json").get("auto_map")))
        copy_side_files(source, out, keep=lambda p: is_tokenizer_file(p) or (code and p.suffix == ".py"))
    return load_tokenizer(out, s.trust_remote_code)


def _check_config(s: InitSettings, overrides: dict) -> None:
    """The preset with `s.config` on top must be a model transformers can build (on `meta`, before anything
    is written); a value of the wrong type or shape is the user's, named as `config`."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        parameter_count(model_config(s.preset, s.attention, 32000, s.match_params, **overrides))
    except (ValueError, TypeError, RuntimeError, StrictDataclassError) as e:  # building on `meta` runs no kernels
        text = str(e).strip().splitlines()
        why = text[-1].strip() if text else type(e).__name__
        raise s.error(f"{ref('config')} does not give a model ({why}); fix the value or drop the key") from None


def init_checkpoint(s: InitSettings) -> InitResult:
    """Write the checkpoint `s` describes (validated before anything is written)."""
    import torch
    from transformers import GenerationConfig

    from longctx.models.gated_qwen3 import causal_lm_class

    s.check_inputs()
    out = Path(s.output)
    dtype = s.dtype or PRESET_DTYPES[s.preset]
    # a folder, or a Hub id's snapshot (fetched now; offline and not cached: one line)
    source = None if s.tokenizer in TOKENIZER_CHOICES else resolve_checkpoint(s.tokenizer, tokenizer_only=True)
    if source is not None:
        require_tokenizer_files(source)  # a local folder was checked with the settings; a snapshot now
        check_tokenizer_source(source, s.trust_remote_code)  # before anything is written
    check_output(out, CHECKPOINT_KIND, inputs=[("tokenizer", source)] if source else [], overwrite=s.overwrite)
    overrides = dict(s.config)
    if s.tie_embeddings is not None:
        overrides["tie_word_embeddings"] = s.tie_embeddings
    if s.config:
        _check_config(s, overrides)
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        tok = _write_tokenizer(s, source, tmp)
        ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
        config = model_config(s.preset, s.attention, len(tok), s.match_params, **{**ids, **overrides})
        baseline_params = parameter_count(model_config(s.preset, "baseline", len(tok), **{**ids, **overrides}))
        torch.manual_seed(s.seed)
        model = causal_lm_class(config)._from_config(config, dtype=getattr(torch, dtype)).eval()
        if not config.tie_word_embeddings:
            # Untied, the output matrix starts as a copy of the input embedding: the model begins as the tied
            # one it replaces, so untying changes only how training moves the two matrices, not the start.
            with torch.no_grad():
                model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp, max_shard_size="5GB")
        GenerationConfig(**ids).save_pretrained(tmp)
        # the RoPE asked for (preset, then --config), as the model transformers builds from the written config
        # computes it (every layer type)
        check_written_rope(tmp, asked_rope({"model_type": config.model_type, **PRESETS[s.preset], **overrides},
                                           config))
        args = {"preset": s.preset, "attention": s.attention, "tokenizer": s.tokenizer,
                "tokenizer_hub": hub_origin(source) if source else None, "match_params": s.match_params,
                "seed": s.seed, "dtype": dtype, **({"bpe_vocab_size": s.vocab_size} if s.tokenizer == "bpe" else {}),
                **({"trust_remote_code": True} if s.trust_remote_code else {}), **overrides}
        write_provenance(tmp, "init", args, None)
    return InitResult(out, config.architectures[0], s.attention, s.preset, dtype, params, baseline_params,
                      config.intermediate_size, config.vocab_size)
