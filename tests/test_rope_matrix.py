"""Every RoPE transformers ships, through every verb that reads or writes one (tests/rope_matrix.py).

For each RoPE-bearing causal-LM architecture of transformers 5.19, saved by transformers itself, and each Hub
layout of the families whose configs carry RoPE in their own keys (Gemma-3's v4 keys, GPT-NeoX's
`rotary_emb_base` / `rotary_pct`, DeepSeek's YaRN with mscale, Qwen2-MoE's `sliding_window` 0, Cohere2, Llama
3.1), alone and as transformers saves it again:
- `info --json` reports, per layer type, what the model's own rotary module computes (the oracle: the module
  transformers builds from the checkpoint's config);
- `yarn --factor 4` writes a config whose rotary modules compute YaRN's formula (written here, from the paper)
  in the layers that see the whole sequence, leave sliding layers as they were, keep DeepSeek's softmax scale,
  and which transformers reads back in the form the input had;
- `extend --rope-base 1e6` checks, before any training, a config whose rotary modules compute the new base in
  those layers (or refuses a YaRN-scaled checkpoint, before training); a sample trains one real step;
- (slow) vLLM computes the same prompt log-probs as transformers on a sample of YaRN-scaled ones.
The architecture table of docs/architectures.md is rendered from this matrix (`render_architecture_table`).
"""

from __future__ import annotations

import contextlib
import json
import math
from functools import cache
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from logprob_helpers import hf_prompt_logprobs, vllm_prompt_logprobs
from rope_matrix import (
    HUB_LAYOUTS,
    TRAINED_LENGTH,
    Matrix,
    config_form,
    entries,
    excluded_model_types,
    extend_refusal,
    lane_params,
    language_model_config,
    long_context_layer_type,
    mla_softmax_scale,
    rope_inv_freq,
    rope_model_types,
    rotary_oracle,
    v4_reader,
    yarn_attention_factor,
    yarn_inv_freq,
    yarn_refusal,
)

from longctx.cli.main import cli

NAMES = list(entries())
FACTOR = 4
NEW_BASE = 1e6
SEQ_LEN = 4 * TRAINED_LENGTH
# What YaRN in place of another scaling keeps of the old RoPE dict (YaRN's own keys when it was YaRN already;
# DeepSeek's mscale keys, which set its softmax scale); everything else of the old scaling goes.
_SCALING_KEYS = ("rope_type", "type", "factor", "original_max_position_embeddings", "max_position_embeddings",
                 "attention_factor", "short_factor", "long_factor", "short_mscale", "long_mscale",
                 "low_freq_factor", "high_freq_factor")
# Entries whose real checkpoints go through vLLM here (slow): per-layer bases, RoPE in the sliding layers only,
# MLA with mscale. (vLLM 0.32 runs GPT-NeoX through its Transformers backend, which decorates transformers' own
# GPTNeoXModel class in place: no transformers GPT-NeoX builds in the same process after it.)
VLLM_SAMPLE = ["gemma3-hub", "cohere2-hub", "deepseek_v2-hub"]
# Entries trained one real step by `extend` (the rest: its checks before training).
EXTEND_SAMPLE = ["gemma3-hub", "gpt_neox-hub", "gemma3-vlm-hub"]
# The Hub layouts whose language model is nested in a composite config (`text_config`).
COMPOSITE = [n for n in NAMES if entries()[n].hub is not None and "text_config" in entries()[n].hub]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="session")
def matrix(tmp_path_factory, reference_tokenizer_dir):
    return Matrix(tmp_path_factory.mktemp("rope-matrix"), reference_tokenizer_dir)


@cache
def _oracle(folder: str):
    return rotary_oracle(Path(folder))


def oracle(folder: Path):
    """What transformers builds from the config.json in `folder` (cached: each folder is written once)."""
    return _oracle(str(folder))


def _config_json(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


# --- the matrix covers what transformers ships ---------------------------------------------------------------


def test_matrix_covers_every_rope_architecture_or_says_why_not():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    covered, excluded = set(rope_model_types()), excluded_model_types()
    assert covered | set(excluded) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert not covered & set(excluded)
    assert all(reason for reason in excluded.values())
    # the families the issue names, and what transformers itself saves of each
    assert {"gemma3_text", "gpt_neox", "deepseek_v2", "deepseek_v3", "qwen2_moe", "cohere2"} <= covered
    assert {n for n in NAMES if n.endswith("-hub")} == set(HUB_LAYOUTS)
    assert {n for n in NAMES if n.endswith("-hub-saved")} == {f"{n}-saved" for n in HUB_LAYOUTS}


@pytest.mark.parametrize("name", lane_params(NAMES))
def test_every_entry_builds_a_rotary_module_whose_rope_is_the_formula(name, matrix):
    """The oracle's own check: each rotary module of each checkpoint computes what the formulas here say of
    its standardised parameters (so the formulas are fit to hold the verbs' outputs to)."""
    o = oracle(matrix.path(name))
    assert o.rotaries, f"{name}: transformers builds no rotary module"
    for r in o.rotaries:
        assert r.computes(*rope_inv_freq(r.parameters, r.head_dim)), (name, r.module, r.layer_type, r.parameters,
                                                                      r.attention_scaling)
    if o.mla_qk_head_dim:  # and DeepSeek's softmax scale is what its attention layers use
        scale = mla_softmax_scale(o.mla_qk_head_dim, o.rotaries[0].parameters)
        assert all(math.isclose(s, scale, rel_tol=1e-6) for s in o.softmax_scales), (name, o.softmax_scales, scale)


def test_transformers_saves_qwen2_moe_with_sliding_window_0(matrix):
    """The config the issue found refused by every verb is what transformers 5.19 writes."""
    cfg = _config_json(matrix.path("qwen2_moe"))
    assert (cfg["sliding_window"], cfg["use_sliding_window"]) == (0, False)
    assert _config_json(matrix.path("qwen2_moe-hub-saved"))["sliding_window"] in (0, None)


# --- info ------------------------------------------------------------------------------------------------------


def _layer_rotaries(o) -> dict[str, object]:
    """{layer type: the oracle's rotary of its layers} over the config's layer types ("full_attention" for a
    config without any, as transformers' own default)."""
    by_type = o.by_layer_type()
    types = o.layer_types or ["full_attention"]
    # a module for every layer; DeepSeek-V4's keeps its attention's RoPE as "main" (its compressor's: "compress")
    shared = by_type.get(None) or by_type.get("main")
    return {t: by_type.get(t, shared) for t in dict.fromkeys(types) if by_type.get(t, shared) is not None}


def _expected_scaling_fields(parameters: dict, max_position_embeddings: int | None) -> tuple:
    """(rope_type, base, factor, original length) of standardised RoPE parameters as transformers' initialisers
    take them: factor of yarn / longrope without one is max / original, the original length only for the types
    that scale from one."""
    kind = parameters.get("rope_type", "default")
    factor = parameters.get("factor")
    original = parameters.get("original_max_position_embeddings") if kind in ("yarn", "longrope", "llama3") else None
    if factor is None and original and kind in ("yarn", "longrope") and max_position_embeddings:
        factor = max_position_embeddings / original
    return kind, parameters["rope_theta"], factor, original


def _close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


@pytest.mark.parametrize("name", lane_params(NAMES))
def test_info_reports_per_layer_type_the_rope_transformers_builds(name, matrix):
    path = matrix.path(name)
    r = run("info", path, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    o = oracle(path)
    layers = d["rope_layers"]
    assert _layer_rotaries(o), (name, o.layer_types, [r.layer_type for r in o.rotaries])
    for layer_type, rotary in _layer_rotaries(o).items():
        assert layer_type in layers, (name, layer_type, layers)
        got = layers[layer_type]
        if got["rope_layers"] == 0:
            continue  # the model applies no RoPE in these layers (Cohere2's full layers): nothing to compare
        kind, base, factor, original = _expected_scaling_fields(rotary.parameters, o.max_position_embeddings)
        want = {"rope_type": kind, "base": base, "factor": factor, "original_max_position_embeddings": original,
                "attention_scaling": rotary.attention_scaling, "rotary_dim": rotary.rotated_dims}
        if o.mla_qk_head_dim:  # the softmax scale DeepSeek's attention derives from mscale_all_dim
            want["softmax_scale"] = mla_softmax_scale(o.mla_qk_head_dim, rotary.parameters)
        diff = {k: (got[k], v) for k, v in want.items() if not _close(got[k], v)}
        assert not diff, (name, layer_type, diff)
    # the top-level fields describe the RoPE of the layers that see the whole sequence
    reported = {r["base"] for r in layers.values() if r["rope_layers"]}
    assert any(_close(d["rope_theta"], b) for b in reported), (name, d["rope_theta"], reported)
    # results.json and sinks.json record the same checkpoint (`model_info`, every measuring verb)
    from longctx.info.describe import model_info

    assert model_info(path)["rope_type"] == d["rope_type"]


def test_info_says_where_cohere2_applies_no_rope(matrix):
    """Cohere2 applies RoPE in its sliding layers only (Cohere2Attention): its full layers have none to scale."""
    for name in ("cohere2-hub", "cohere2"):
        d = json.loads(run("info", matrix.path(name), "--json").output)["rope_layers"]
        assert d["full_attention"]["rope_layers"] == 0 and d["sliding_attention"]["rope_layers"] >= 1, d
        text = run("info", matrix.path(name)).output
        assert "no RoPE" in text, text


def test_info_shows_gemma3_local_base_and_pythia_base(matrix):
    """The issue's cases in words: Gemma-3's local base 1e4 beside the global 1e6 with linear x8, Pythia's base
    50000 (rotary_emb_base) over a quarter of each head."""
    gemma = json.loads(run("info", matrix.path("gemma3-hub"), "--json").output)["rope_layers"]
    assert (gemma["full_attention"]["rope_type"], gemma["full_attention"]["base"], gemma["full_attention"]["factor"]) \
        == ("linear", 1e6, 8.0)
    assert (gemma["sliding_attention"]["rope_type"], gemma["sliding_attention"]["base"]) == ("default", 1e4)
    pythia = json.loads(run("info", matrix.path("gpt_neox-hub"), "--json").output)
    assert pythia["rope_theta"] == 50000 and pythia["rope_layers"]["full_attention"]["rotary_dim"] == 16


# --- yarn ------------------------------------------------------------------------------------------------------


def _trained_length(rotary, max_position_embeddings: int | None) -> int:
    """The length YaRN scales from: the original length of a scaled RoPE, else max_position_embeddings (else
    the length the test passes, TRAINED_LENGTH)."""
    original = rotary.parameters.get("original_max_position_embeddings")
    if rotary.parameters.get("rope_type", "default") in ("yarn", "longrope", "llama3") and original:
        return original
    if rotary.parameters.get("rope_type") == "linear":
        return round(max_position_embeddings / rotary.parameters["factor"])
    return max_position_embeddings or TRAINED_LENGTH


def _yarn_args(name: str, src_oracle) -> list[str]:
    """`--rescale` where the checkpoint scales already; for linear scaling, which records no original length,
    the length it was trained at (max_position_embeddings / factor, as the Hub's Gemma-3 configs have it), and
    for a config without max_position_embeddings (RecurrentGemma's) the trained length."""
    args = []
    if src_oracle.max_position_embeddings is None:
        args += ["--original-max-position-embeddings", TRAINED_LENGTH]
    kinds = {r.parameters.get("rope_type", "default") for r in src_oracle.rotaries}
    if kinds - {"default"}:
        args.append("--rescale")
    if "linear" in kinds:
        linear = next(r for r in src_oracle.rotaries if r.parameters.get("rope_type") == "linear")
        args += ["--original-max-position-embeddings", _trained_length(linear, src_oracle.max_position_embeddings)]
    return args


@pytest.fixture(scope="session")
def yarned(matrix, tmp_path_factory):
    """get(name): (the CliRunner result, the output folder) of `yarn --factor 4` on the entry, run once."""
    root = tmp_path_factory.mktemp("rope-matrix-yarn")
    done = {}

    def get(name):
        if name not in done:
            src = matrix.path(name)
            done[name] = (run("yarn", src, "--factor", FACTOR, *_yarn_args(name, oracle(src)), "-o", root / name),
                          root / name)
        return done[name]

    return get


def _expected_yarn(rotary, max_position_embeddings: int) -> dict:
    """The RoPE parameters YaRN x4 should have in place of `rotary`'s: its base and rotated share, YaRN from
    the length it was trained at, and of a YaRN it replaces its own keys (betas, truncate, DeepSeek's mscale)."""
    p = rotary.parameters
    kept = {k: v for k, v in p.items() if k not in _SCALING_KEYS} if p.get("rope_type") == "yarn" else {
        k: v for k, v in p.items() if k == "partial_rotary_factor"}
    return {**kept, "rope_type": "yarn", "rope_theta": p["rope_theta"], "factor": float(FACTOR),
            "original_max_position_embeddings": _trained_length(rotary, max_position_embeddings)}


def _yarn_reference(expected: dict, head_dim: int):
    dim = int(head_dim * (expected.get("partial_rotary_factor") or 1.0))
    inv = yarn_inv_freq(dim, expected["rope_theta"], expected["factor"], expected["original_max_position_embeddings"],
                        expected.get("beta_fast") or 32, expected.get("beta_slow") or 1,
                        expected.get("truncate", True))
    return inv, yarn_attention_factor(expected["factor"], expected.get("mscale"), expected.get("mscale_all_dim"))


@pytest.mark.parametrize("name", lane_params(NAMES))
def test_yarn_writes_yarn_in_the_layers_that_see_the_whole_sequence(name, matrix, yarned):
    src = matrix.path(name)
    r, out = yarned(name)
    before = oracle(src)
    if yarn_refusal(entries()[name].text_model_type, before):
        assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not out.exists()
        return
    assert r.exit_code == 0, r.output
    after = oracle(out)
    trained = min(_trained_length(x, before.max_position_embeddings) for x in before.rotaries)
    assert after.max_position_embeddings == FACTOR * trained, (name, after.max_position_embeddings)
    after_by_type = after.by_layer_type()
    for rotary in before.rotaries:
        if rotary.module != before.rotaries[0].module:
            continue  # a second module of the same class (per-layer copies) is checked as the first
        new = after_by_type[rotary.layer_type]
        if long_context_layer_type(rotary.layer_type):
            want = _expected_yarn(rotary, before.max_position_embeddings)
            assert new.computes(*_yarn_reference(want, rotary.head_dim)), (name, rotary.layer_type, new.parameters,
                                                                           new.attention_scaling, want)
        else:  # a sliding layer type with its own RoPE keeps it
            assert torch.equal(new.inv_freq, rotary.inv_freq), (name, rotary.layer_type, new.parameters)
            assert new.attention_scaling == rotary.attention_scaling
    if before.mla_qk_head_dim:  # MLA: the softmax scale DeepSeek's attention derives from mscale_all_dim
        want = _expected_yarn(before.rotaries[0], before.max_position_embeddings)
        scale = mla_softmax_scale(before.mla_qk_head_dim, want)
        assert all(math.isclose(s, scale, rel_tol=1e-6) for s in after.softmax_scales), (name, after.softmax_scales)


@pytest.mark.parametrize("name", lane_params([n for n in NAMES if n.endswith(("-hub", "-hub-saved"))
                                              or n in ("gemma3_text", "modernbert-decoder", "gemma3n_text")]))
def test_yarn_keeps_the_form_transformers_reads(name, matrix, yarned):
    """Per-layer forms stay per layer: Gemma-3's Hub keys (rope_scaling for the global layers beside
    rope_local_base_freq), transformers 5's per-layer-type rope_parameters; transformers builds the written
    config as it is (AutoConfig.from_pretrained)."""
    from transformers import AutoConfig

    src, (r, out) = language_model_config(_config_json(matrix.path(name))), yarned(name)
    assert r.exit_code == 0, r.output
    cfg = language_model_config(_config_json(out))
    params = src.get("rope_parameters")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        assert set(cfg["rope_parameters"]) == set(params), cfg.get("rope_parameters")
    if "rope_local_base_freq" in src:  # Gemma-3's Hub form
        assert cfg.get("rope_local_base_freq") == src["rope_local_base_freq"], cfg
        assert (cfg.get("rope_scaling") or {}).get("rope_type") == "yarn" and "rope_parameters" not in cfg, cfg
    AutoConfig.from_pretrained(out)


HUB_FORMS = [n for n in NAMES if entries()[n].hub is not None]


@pytest.mark.parametrize("name", HUB_FORMS)
def test_yarn_and_extend_write_the_form_the_input_had(name, matrix, yarned, tmp_path):
    """v4 keys in, v4 keys out (v5 in, v5 out): a reader that knows only the transformers-4 keys (transformers
    4.x, llama.cpp's converter), which read the input, sees YaRN x4 from the trained length in what `yarn`
    writes, and the new base under the old scaling in what `extend` writes."""
    from longctx.core.errors import InputError
    from longctx.extend.loop import _validate
    from longctx.extend.settings import ExtendSettings

    src = matrix.path(name)
    before, cfg = oracle(src), _config_json(src)
    long = next(r for r in before.rotaries if long_context_layer_type(r.layer_type) and r.parameters)
    r, out = yarned(name)
    assert r.exit_code == 0, r.output
    written = _config_json(out)
    assert config_form(written) == config_form(cfg), (name, config_form(cfg), written)
    trained = _trained_length(long, before.max_position_embeddings)
    if config_form(cfg) in ("v4", "both"):
        assert v4_reader(written) == {"base": long.parameters["rope_theta"], "rope_type": "yarn", "factor": FACTOR,
                                      "original": trained, "max_position_embeddings": FACTOR * trained}, written
    s = ExtendSettings(checkpoint=str(src), output=str(tmp_path / "out"), seq_len=SEQ_LEN, rope_base=NEW_BASE,
                       data=["synthetic:mixed"], steps=1, cache_dir=str(tmp_path / "cache"))
    with contextlib.ExitStack() as held:
        if extend_refusal(before):
            with pytest.raises(InputError):
                _validate(s, 1, False, held)
            return
        _, new_cfg, _ = _validate(s, 1, False, held)
    assert config_form(new_cfg) == config_form(cfg), (name, new_cfg)
    if config_form(cfg) in ("v4", "both"):
        old = v4_reader(cfg)
        assert v4_reader(new_cfg) == {**old, "base": NEW_BASE, "max_position_embeddings": SEQ_LEN}, new_cfg


@pytest.mark.parametrize("name", COMPOSITE)
def test_yarn_changes_a_composite_config_in_its_language_model_only(name, matrix, yarned):
    """The wrapper and the vision tower stay as they were: every key of config.json but `text_config` byte for
    byte, in `text_config` only the RoPE keys, the length and head_dim, and the weights are the same files."""
    src = matrix.path(name)
    r, out = yarned(name)
    assert r.exit_code == 0, r.output
    before, after = _config_json(src), _config_json(out)
    assert json.dumps({k: v for k, v in after.items() if k != "text_config"}) == json.dumps(
        {k: v for k, v in before.items() if k != "text_config"})
    rope_keys = {"rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "head_dim"}
    changed = {k for k in {*before["text_config"], *after["text_config"]}
               if before["text_config"].get(k) != after["text_config"].get(k)}
    assert changed and changed <= rope_keys, changed
    for f in src.glob("*.safetensors"):
        assert (out / f.name).stat().st_ino == f.stat().st_ino
    d = json.loads(run("info", out, "--json").output)
    assert d["language_model"] == f"text_config ({entries()[name].text_model_type})", d["language_model"]


def test_yarn_says_cohere2_full_layers_have_no_rope_to_scale(yarned):
    r, _ = yarned("cohere2-hub")
    assert r.exit_code == 0, r.output
    note = next(line for line in r.output.splitlines() if "note:" in line and "no RoPE" in line)
    assert "full" in note and "(1 of 2)" in note, r.output


def test_yarn_keeps_deepseek_mscale(yarned, matrix):
    """DeepSeek-V2-Lite's mscale = mscale_all_dim = 0.707 stay, so the softmax scale stays DeepSeek's."""
    r, out = yarned("deepseek_v2-hub")
    assert r.exit_code == 0, r.output
    cfg = _config_json(out)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    assert (rope["mscale"], rope["mscale_all_dim"]) == (0.707, 0.707), rope


# --- extend ------------------------------------------------------------------------------------------------


def _expected_rebased(rotary, base: float) -> dict:
    return {**rotary.parameters, "rope_theta": base}


def _check_rebased(name: str, before, after) -> None:
    """`after` (transformers' build of extend's config) has the new base in the layers that see the whole
    sequence, the old scaling kept under it, sliding layer types as they were, and max length SEQ_LEN."""
    assert after.max_position_embeddings == SEQ_LEN, (name, after.max_position_embeddings)
    after_by_type = after.by_layer_type()
    for rotary in before.rotaries:
        if rotary.module != before.rotaries[0].module:
            continue
        new = after_by_type[rotary.layer_type]
        if long_context_layer_type(rotary.layer_type):
            assert new.computes(*rope_inv_freq(_expected_rebased(rotary, NEW_BASE), rotary.head_dim)), (
                name, rotary.layer_type, new.parameters, new.attention_scaling)
        else:
            assert torch.equal(new.inv_freq, rotary.inv_freq), (name, rotary.layer_type, new.parameters)


@pytest.mark.parametrize("name", lane_params(NAMES))
def test_extend_checks_the_new_base_before_training(name, matrix, tmp_path):
    """extend's checks before any work (`longctx.extend.loop._validate`): the config it will write, built by
    transformers, has the new base where it should; or a one-line refusal, with nothing written."""
    from longctx.core.errors import InputError
    from longctx.extend.loop import _validate
    from longctx.extend.settings import ExtendSettings

    src = matrix.path(name)
    before = oracle(src)
    s = ExtendSettings(checkpoint=str(src), output=str(tmp_path / "out"), seq_len=SEQ_LEN, rope_base=NEW_BASE,
                       data=["synthetic:mixed"], steps=1, cache_dir=str(tmp_path / "cache"))
    with contextlib.ExitStack() as held:
        if extend_refusal(before):
            with pytest.raises(InputError, match="YaRN|fitted|longctx yarn"):
                _validate(s, 1, False, held)
            assert not (tmp_path / "out").exists() and not (tmp_path / "out.train").exists()
            return
        _, new_cfg, _ = _validate(s, 1, False, held)
    _check_rebased(name, before, rotary_oracle(new_cfg))


@pytest.mark.parametrize("name", EXTEND_SAMPLE)
@pytest.mark.slow
def test_extend_trains_one_step_with_the_new_base(name, matrix, tmp_path):
    src, out = matrix.path(name), tmp_path / "ext"
    r = run("extend", src, "--rope-base", NEW_BASE, "--seq-len", SEQ_LEN, "--data", "synthetic:mixed", "--steps", 1,
            "--tokens-per-step", SEQ_LEN, "--cache-dir", tmp_path / "cache", "-o", out)
    assert r.exit_code == 0, r.output
    _check_rebased(name, oracle(src), oracle(out))
    if name in COMPOSITE:  # training the language model leaves the vision tower's weights as they were
        assert "extend trains its language model (text_config) on text" in r.output, r.output
        from safetensors.torch import load_file

        before, after = load_file(next(src.glob("*.safetensors"))), load_file(next(out.glob("*.safetensors")))
        vision = [k for k in before if "language_model" not in k and "lm_head" not in k]
        assert vision and all(torch.equal(before[k], after[k]) for k in vision), vision


# --- vLLM ----------------------------------------------------------------------------------------------------


def _prompt(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 32000, (length,), generator=generator).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", VLLM_SAMPLE)
def test_vllm_and_transformers_agree_on_the_yarned_checkpoint(name, matrix, yarned, vllm_engines):
    """Prompt log-probs over 2.5x the trained length agree between transformers and vLLM (fp32), and differ
    from the unscaled checkpoint's past the trained length (the scaling is on)."""
    r, out = yarned(name)
    assert r.exit_code == 0, r.output
    length = oracle(out).max_position_embeddings
    ids = _prompt(int(TRAINED_LENGTH * 2.5))
    hf_lp, unscaled = hf_prompt_logprobs(out, ids), hf_prompt_logprobs(matrix.path(name), ids)
    assert (unscaled - hf_lp)[TRAINED_LENGTH:].abs().max().item() > 1e-3
    vllm_lp = vllm_prompt_logprobs(vllm_engines.get(out, max_model_len=length), ids)
    assert (vllm_lp - hf_lp).abs().max().item() <= 1e-3, (vllm_lp - hf_lp).abs().max().item()


# --- the measuring verbs on what transformers saves --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2_moe-hub-saved", "gemma3-hub-saved", "deepseek_v2-hub-saved",
                                  "gemma3-vlm-hub", "mistral3-vlm-hub"])
def test_ruler_and_sinks_run_on_what_transformers_saves(name, matrix, yarned, tmp_path):
    """The configs transformers writes itself (Qwen2-MoE's sliding_window 0, Gemma-3's per-layer-type RoPE,
    DeepSeek's YaRN with mscale) and the composite Hub layouts (a language model in `text_config` beside a vision
    tower), YaRN-scaled, through `ruler` (hf) past the trained length and `sinks`."""
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings
    from longctx.report.run import write_report

    r, out = yarned(name)
    assert r.exit_code == 0, r.output
    length = FACTOR * TRAINED_LENGTH
    run_ruler(RulerRunSettings(checkpoint=str(out), lengths=[length], output=str(tmp_path / "run"),
                               tasks="niah_single_1", samples=1, backend="hf"), progress=False, log=lambda _: None)
    results = write_report(tmp_path / "run").results
    assert results["model"]["rope_type"] == "yarn" and results["model"]["context_length"] == length
    assert results["samples"]["niah_single_1"][length] == 1
    s = run("sinks", matrix.path(name), "--tokens", 128, "--length", 64, "-o", tmp_path / "sinks")
    assert s.exit_code == 0, s.output
    assert (tmp_path / "sinks" / "sinks.json").exists()


# Every verb of the CLI: how the matrix runs it on what transformers saves, or why it does not.
VERBS = {
    "info": "every entry (test_info_reports_per_layer_type_the_rope_transformers_builds)",
    "yarn": "every entry (test_yarn_writes_yarn_in_the_layers_that_see_the_whole_sequence)",
    "extend": "every entry's checks before training; one step on EXTEND_SAMPLE",
    "ruler": "hf, on the transformers-saved Qwen2-MoE, Gemma-3 and DeepSeek-V2 and the composite Gemma-3 and "
             "Mistral-3, YaRN-scaled (slow)",
    "sinks": "on the transformers-saved Qwen2-MoE, Gemma-3 and DeepSeek-V2 and the composite ones (slow)",
}
EXEMPT = {
    "init": "writes its own Qwen3 presets, not a checkpoint of another architecture",
    "convert": "reads the paper's released gated-attention layout into the gated Qwen3 family only",
    "compare": "reads RULER runs, not checkpoints",
    "export": "reads RULER runs, not checkpoints",
    "run": "runs recipes, whose stages are the verbs above",
}


def test_every_verb_is_in_the_matrix_or_says_why_not():
    assert set(cli.commands) == set(VERBS) | set(EXEMPT)
    assert not set(VERBS) & set(EXEMPT)


# --- the docs' architecture table ------------------------------------------------------------------------------


def test_docs_architecture_table_is_the_matrix():
    from rope_matrix import docs_table, render_architecture_table

    assert docs_table() == render_architecture_table(), (
        "docs/architectures.md's architecture table differs from the matrix; regenerate it: "
        ".venv/bin/python tests/rope_matrix.py --write-docs")
