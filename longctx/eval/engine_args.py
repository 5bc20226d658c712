"""vLLM engine arguments given by name (`--engine-arg KEY=VALUE`, a recipe's `ruler.backend_options.engine_args`).

Names and value types are vLLM's own: the fields of `vllm.engine.arg_utils.EngineArgs`, each value converted by
the type its `vllm serve` option has (`EngineArgs.add_cli_args`), so `max_num_seqs=64`, `kv_cache_dtype=fp8`,
`enable_prefix_caching=false` and `hf_overrides={"rope_theta": 1e6}` mean what they mean to `vllm serve`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from typing import Any

from longctx.core.errors import SettingError, ref
from longctx.core.kinds import did_you_mean

# Engine arguments longctx sets itself, and where the user sets them instead: a setting of `ruler run` (named
# with `ref`: the messages are `SettingError`s, named by whoever shows them) or words.
OWN = {"model": "the checkpoint argument", "max_model_len": f"derived from {ref('lengths')}",
       "tokenizer": "the task files are cut with the checkpoint's own tokenizer",
       "tokenizer_revision": "the checkpoint argument names the revision",
       "revision": "the checkpoint argument names the revision",
       "skip_tokenizer_init": "prompts are text, so the engine needs its tokenizer",
       **{name: ref(name) for name in ("dtype", "tensor_parallel_size", "data_parallel_size",
                                       "gpu_memory_utilization", "enforce_eager", "trust_remote_code")},
       "kv_cache_memory_bytes": ref("kv_cache_memory"), "seed": "greedy decoding; the engine seed is recorded as 0"}
# Engine arguments that size or schedule the work without changing what the model computes: a run directory
# is not bound to them, so a resume may change them (e.g. a smaller batch after running out of memory).
RESOURCES = frozenset({"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "swap_space",
                       "cpu_offload_gb", "block_size", "disable_log_stats", "max_parallel_loading_workers",
                       "num_gpu_blocks_override", "enable_chunked_prefill"})
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@functools.cache
def _options() -> dict[str, argparse.Action | None]:
    """EngineArgs field -> its `vllm serve` option (None for a field without one)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    actions = {a.dest: a for a in EngineArgs.add_cli_args(FlexibleArgumentParser())._actions}
    return {f.name: actions.get(f.name) for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_")}


def _flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise SettingError(f"{what} must be true or false, got {value!r}")


def _convert(action: argparse.Action, value: Any, what: str) -> Any:
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return _flag(value, what)
    if action.nargs in ("+", "*") and not isinstance(value, list):
        value = str(value).split()
    if isinstance(value, list):
        return [_convert_one(action, v, what) for v in value]
    return _convert_one(action, value, what)


def _convert_one(action: argparse.Action, value: Any, what: str) -> Any:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    if isinstance(value, bool):
        text = text.lower()
    try:
        typed = action.type(text) if action.type is not None else text
    except RecursionError:  # vLLM's JSON arguments are parsed with json.loads, unbounded
        raise SettingError(f"{what}: vLLM's {action.option_strings[0]} refuses a value nested this deep") from None
    except (ValueError, TypeError, argparse.ArgumentTypeError, json.JSONDecodeError) as e:
        raise SettingError(f"{what}: vLLM's {action.option_strings[0]} refuses {value!r} ({e})") from None
    if action.choices is not None and typed not in action.choices:
        shown = ", ".join(map(str, action.choices))
        raise SettingError(f"{what} must be one of {shown}, got {value!r}{did_you_mean(str(value), action.choices)}")
    return typed


def typed_engine_args(given: dict[str, Any], label: str = ref("engine_args")) -> dict[str, Any]:
    """`given` with every value converted to the type vLLM gives it; SettingError (its names are `ruler run`'s
    settings, `label` first, owner left to the caller) for a name vLLM does not have, one longctx sets itself,
    or a value of the wrong type."""
    options = _options()
    out = {}
    for key, value in given.items():
        if key in OWN:
            raise SettingError(f"{label} {key}: longctx sets this one ({OWN[key]})")
        if key not in options:
            raise SettingError(f"{label} {key}: vLLM's EngineArgs has no such field"
                               f"{did_you_mean(key, list(options))}")
        action = options[key]
        out[key] = value if action is None else _convert(action, value, f"{label} {key}")
    return out


def binding_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments a run directory is bound to: all but those that only size or schedule the work."""
    return {k: v for k, v in engine_args.items() if k not in RESOURCES}
