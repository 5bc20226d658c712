"""Every RoPE that real checkpoints carry, read and written exactly (issue 30): per-layer-type RoPE (Gemma-3 in its
Hub form and as transformers 5 saves it), legacy keys (GPT-NeoX / Pythia `rotary_emb_base`, `rotary_pct`),
DeepSeek-V2's MLA YaRN (`mscale`, `mscale_all_dim`), Qwen2-MoE as transformers saves it (`"sliding_window": 0`),
and Cohere2, whose full-attention layers use no RoPE: tiny configs in those exact layouts through `info`, `yarn`
and `extend`'s checks before training.

The oracle is transformers' own rotary module of each family, built here from the written config
(`Gemma3RotaryEmbedding`, `GPTNeoXRotaryEmbedding`, ... in transformers 5.19), and the independent YaRN formula
is `longctx.rope.reference` (Peng et al., arXiv 2309.00071). DeepSeek's softmax scale: transformers
5.19 models/deepseek_v2/modeling_deepseek_v2.py `yarn_apply_mscale`.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.rope.reference import (
    mla_softmax_multiplier,
    yarn_attention_factor,
    yarn_attention_scaling,
    yarn_inv_freq,
)

_SHAPE = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# google/gemma-3-4b-it's text_config (transformers 4.50), 6 layers: 5 local (sliding) then 1 global
GEMMA3_HUB = {**_SHAPE, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": 6,
              "max_position_embeddings": 2048, "rope_theta": 1000000.0,
              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_local_base_freq": 10000.0,
              "sliding_window": 128, "sliding_window_pattern": 6, "query_pre_attn_scalar": 64,
              "transformers_version": "4.50.0.dev0"}
# EleutherAI/pythia-*: the base in rotary_emb_base, a quarter of each head rotated
PYTHIA = {**_SHAPE, "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "num_hidden_layers": 2,
          "max_position_embeddings": 2048, "rotary_emb_base": 50000, "rotary_pct": 0.25,
          "use_parallel_residual": True, "hidden_act": "gelu", "transformers_version": "4.24.0"}
# CohereForAI/c4ai-command-r7b-12-2024: sliding layers with RoPE, every 4th layer global without
COHERE2 = {**_SHAPE, "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "num_hidden_layers": 4,
           "max_position_embeddings": 2048, "rope_theta": 50000.0, "rope_scaling": None, "sliding_window": 128,
           "sliding_window_pattern": 4, "logit_scale": 0.25}
# deepseek-ai/DeepSeek-V2-Lite's layout (MLA, YaRN with DeepSeek's mscale keys), qk_head_dim 64 + 64
DEEPSEEK_V2 = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 1000,
               "hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
               "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 64, "q_lora_rank": None,
               "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "max_position_embeddings": 1024,
               "rope_theta": 10000, "bos_token_id": 1, "eos_token_id": 2,
               "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 256, "mscale": 1.0,
                                "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}}
# the softmax scale of that attention: 1/sqrt(128) x mscale(4, 1)^2
DEEPSEEK_SOFTMAX = 128 ** -0.5 * (0.1 * math.log(4) + 1) ** 2


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_exit_2(r, message):
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def _folder(path: Path, cfg: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def _saved_by_transformers(path: Path, config_class: str, **values) -> Path:
    """A config folder as transformers 5.19 writes it (`save_pretrained`)."""
    import transformers

    getattr(transformers, config_class)(**values).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """{name: a config-only checkpoint folder in that exact layout}."""
    root = tmp_path_factory.mktemp("layouts")
    hub = {k: v for k, v in GEMMA3_HUB.items() if k not in ("model_type", "transformers_version")}
    return {
        "gemma3-hub": _folder(root / "gemma3-hub", GEMMA3_HUB),
        "gemma3-v5": _saved_by_transformers(root / "gemma3-v5", "Gemma3TextConfig", **hub),
        "pythia": _folder(root / "pythia", PYTHIA),
        "cohere2": _folder(root / "cohere2", COHERE2),
        "deepseek-v2": _folder(root / "deepseek-v2", DEEPSEEK_V2),
        "qwen2-moe": _saved_by_transformers(
            root / "qwen2-moe", "Qwen2MoeConfig", **_SHAPE, num_hidden_layers=2, max_position_embeddings=2048,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
            architectures=["Qwen2MoeForCausalLM"]),
    }


def oracle(folder: Path) -> dict:
    """{layer type (None: every layer): (inv_freq, attention scaling, rope_type, base)} of the family's rotary
    module transformers builds from the folder's config."""
    from transformers import AutoConfig
    from transformers.models.cohere2.modeling_cohere2 import Cohere2RotaryEmbedding
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeRotaryEmbedding

    config = AutoConfig.from_pretrained(folder)
    module = {"gemma3_text": Gemma3RotaryEmbedding, "gpt_neox": GPTNeoXRotaryEmbedding,
              "cohere2": Cohere2RotaryEmbedding, "deepseek_v2": DeepseekV2RotaryEmbedding,
              "qwen2_moe": Qwen2MoeRotaryEmbedding}[config.model_type](config)
    params = config.rope_parameters
    if isinstance(module.rope_type, dict):
        return {lt: (getattr(module, f"{lt}_inv_freq"), getattr(module, f"{lt}_attention_scaling"), t,
                     params[lt]["rope_theta"]) for lt, t in module.rope_type.items()}
    return {None: (module.inv_freq, module.attention_scaling, module.rope_type, params["rope_theta"])}


def default_inv_freq(dim: int, base: float):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def info(folder: Path) -> dict:
    r = run("info", folder, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# --- info: what transformers builds ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gemma3-hub", "gemma3-v5", "pythia", "cohere2", "deepseek-v2", "qwen2-moe"])
def test_info_reports_per_layer_type_what_the_rotary_module_computes(name, layouts):
    d = info(layouts[name])
    truth = oracle(layouts[name])
    for lt, built in d["rope_layers"].items():
        inv, scaling, rope_type, base = truth.get(lt, truth.get(None))
        assert (built["rope_type"], built["base"], built["rotary_dim"]) == (rope_type, base, 2 * len(inv)), lt
        assert math.isclose(built["attention_scaling"], scaling), lt
    # the long-context layers' RoPE, as the flat fields say it, is what those layers compute
    long = d["rope_layers"]["full_attention"]
    if long["rope_layers"]:
        assert (d["rope_type"], d["rope_theta"], d["rope_factor"]) == (long["rope_type"], long["base"], long["factor"])


def test_info_gemma3_both_forms_show_global_factor_and_local_base(layouts):
    for name in ("gemma3-hub", "gemma3-v5"):
        layers = info(layouts[name])["rope_layers"]
        assert layers["full_attention"] | {"softmax_scale": None} == {
            "layers": 1, "rope_layers": 1, "rope_type": "linear", "base": 1e6, "factor": 8.0,
            "original_max_position_embeddings": None, "attention_scaling": 1.0, "softmax_scale": None,
            "rotary_dim": 64}
        assert (layers["sliding_attention"]["rope_type"], layers["sliding_attention"]["base"],
                layers["sliding_attention"]["layers"]) == ("default", 1e4, 5)
        text = run("info", layouts[name]).output
        assert "full_attention (1 of 6 layers): linear, base 1000000, factor 8" in text
        assert "sliding_attention (5 of 6 layers): default, base 10000" in text


def test_info_pythia_reads_rotary_emb_base_and_rotary_pct(layouts):
    d = info(layouts["pythia"])
    assert (d["rope_theta"], d["rope_theta_from_default"]) == (50000, False)
    assert (d["rope_layers"]["full_attention"]["base"], d["rope_layers"]["full_attention"]["rotary_dim"]) == (50000, 16)
    assert "rope                     default, base 50000" in run("info", layouts["pythia"]).output


def test_info_shows_the_longrope_factor(tmp_path):
    """microsoft/Phi-3-mini-128k-instruct's layout: LongRoPE without `factor`; transformers scales by 131072 / 4096."""
    phi3 = {**_SHAPE, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "num_hidden_layers": 2,
            "vocab_size": 32064, "pad_token_id": 32000, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [1.5] * 32}}
    d = info(_folder(tmp_path / "phi3", phi3))
    assert (d["rope_type"], d["rope_factor"], d["original_max_position_embeddings"]) == ("longrope", 32.0, 4096)
    built = d["rope_layers"]["full_attention"]
    assert (built["rope_type"], built["factor"], built["original_max_position_embeddings"]) == ("longrope", 32.0, 4096)
    assert math.isclose(built["attention_scaling"], math.sqrt(1 + math.log(32) / math.log(4096)))  # Phi-3's scale


def test_info_says_where_rope_cannot_reach(layouts):
    d = info(layouts["cohere2"])
    assert (d["rope_layers"]["full_attention"]["layers"], d["rope_layers"]["full_attention"]["rope_layers"]) == (1, 0)
    assert d["rope_layers"]["sliding_attention"]["rope_layers"] == 3
    assert "full_attention (1 of 4 layers): no RoPE" in run("info", layouts["cohere2"]).output


def test_info_deepseek_softmax_scale_is_mla_yarn(layouts):
    built = info(layouts["deepseek-v2"])["rope_layers"]["full_attention"]
    assert math.isclose(built["softmax_scale"], DEEPSEEK_SOFTMAX, rel_tol=1e-9)
    assert math.isclose(DEEPSEEK_SOFTMAX, 0.1146, abs_tol=5e-5)  # the number
    assert (built["rope_type"], built["factor"], built["original_max_position_embeddings"]) == ("yarn", 4.0, 256)
    assert math.isclose(built["attention_scaling"], yarn_attention_factor(4.0, 1.0, 1.0))  # mscale / mscale_all_dim


# --- yarn: Gemma-3 in both forms --------------------------------------------------------------------------


def _yarn(src: Path, out: Path, *flags):
    r = run("yarn", src, "--factor", 4, "--rescale", "--original-max-position-embeddings", 256, "-o", out, *flags)
    assert r.exit_code == 0, r.output
    return r.output, json.loads((out / "config.json").read_text())


def _assert_gemma3_yarn(out: Path):
    """Global layers: YaRN x4 from 256 at base 1e6 (the reference, bit for bit); local layers: base 1e4 untouched."""
    truth = oracle(out)
    inv, scaling, rope_type, base = truth["full_attention"]
    assert (rope_type, base) == ("yarn", 1e6)
    assert torch.equal(inv, yarn_inv_freq(64, 1e6, 4.0, 256))
    assert math.isclose(scaling, yarn_attention_scaling(4.0))
    inv, scaling, rope_type, base = truth["sliding_attention"]
    assert (rope_type, base, scaling) == ("default", 1e4, 1.0)
    assert torch.equal(inv, default_inv_freq(64, 1e4))


@pytest.mark.parametrize("name", ["gemma3-hub", "gemma3-v5"])
def test_yarn_gemma3_scales_the_global_layers_keeps_the_local_base_and_the_form(name, layouts, tmp_path):
    output, cfg = _yarn(layouts[name], tmp_path / "out")
    _assert_gemma3_yarn(tmp_path / "out")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    if name == "gemma3-hub":  # transformers-4 form in, transformers-4 form out
        assert (cfg["rope_theta"], cfg["rope_local_base_freq"], cfg["rope_scaling"]) == (1e6, 1e4, yarn)
        assert "rope_parameters" not in cfg
    else:
        assert cfg["rope_parameters"] == {"full_attention": {**yarn, "rope_theta": 1000000},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000}}
        assert not {"rope_theta", "rope_scaling", "rope_local_base_freq"} & set(cfg)
    assert cfg["max_position_embeddings"] == 1024
    assert ("the sliding-attention layers (5 of 6) keep their RoPE (default, base 10000)" in output
            and "replaced linear scaling (factor 8) with YaRN from original length 256" in output)
    d = info(tmp_path / "out")
    assert (d["rope_type"], d["yarn_factor"], d["context_length"]) == ("yarn", 4.0, 1024)
    assert d["rope_layers"]["full_attention"]["rope_type"] == "yarn"


@pytest.mark.parametrize("name,fmt", [("gemma3-hub", "v5"), ("gemma3-v5", "v4"), ("gemma3-hub", "both")])
def test_yarn_gemma3_in_the_other_form_when_asked(name, fmt, layouts, tmp_path):
    _, cfg = _yarn(layouts[name], tmp_path / "out", "--config-format", fmt)
    _assert_gemma3_yarn(tmp_path / "out")
    assert ("rope_parameters" in cfg) == (fmt != "v4") and ("rope_local_base_freq" in cfg) == (fmt != "v5")


def test_a_yarn_key_transformers_ignores_for_per_layer_rope_is_refused(layouts, tmp_path):
    """transformers 5.19 reads YaRN's `truncate` from the top of rope_parameters (`_compute_yarn_parameters`), so a
    per-layer config's truncate false changes nothing: the check on the built module refuses it, nothing written."""
    out = tmp_path / "out"
    r = run("yarn", layouts["gemma3-v5"], "--factor", 4, "--rescale", "--original-max-position-embeddings", 256,
            "--no-truncate", "-o", out)
    one_line_exit_2(r, "the model transformers builds from it computes full_attention layers: inv_freq up to")
    assert not out.exists()


def test_gemma3_without_rescale_names_its_global_layers(layouts):
    one_line_exit_2(run("yarn", layouts["gemma3-hub"], "--factor", 4),
                    "checkpoint (its full-attention layers) is already linear-scaled (factor 8) and its config does "
                    "not record the original length")


def test_a_flat_rope_written_onto_gemma3_is_refused_on_the_built_module(layouts):
    """The old `yarn` output: a flat yarn rope_parameters, which Gemma3TextConfig ignores (both layer types then
    compute plain RoPE). Its RoPE dict has the asked keys at the top; the rotary module says otherwise."""
    from longctx.rope.config import RopeSettings, check_written_rope, write_rope

    asked = RopeSettings("yarn", 1000000, 1024, factor=4.0, original_max_position_embeddings=256)
    with pytest.raises(InputError, match=r"^'config.json': the model transformers builds from it computes "
                                         r"sliding_attention layers: .*; full_attention layers: inv_freq up to "
                                         r"[0-9.]+ \(relative\) off the asked yarn \(base 1e\+06, factor 4, original "
                                         r"length 256\), attention scaling 1.0 \(asked 1.13863\); longctx cannot "
                                         r"write this RoPE for model_type 'gemma3_text'$"):
        check_written_rope(write_rope(GEMMA3_HUB, asked, "v5"), asked)


# --- yarn: legacy keys, MLA, what transformers saves, NoPE layers ---------------------------------------------


@pytest.mark.parametrize("fmt", ["v5", "v4"])
def test_yarn_pythia_keeps_base_50000_and_the_partial_rotation(fmt, layouts, tmp_path):
    r = run("yarn", layouts["pythia"], "--factor", 4, "--config-format", fmt, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "no RoPE base" not in r.output
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    if fmt == "v5":
        assert cfg["rope_parameters"]["rope_theta"] == 50000 and "rotary_emb_base" not in cfg
    else:  # GPTNeoXConfig reads its transformers-4 base from rotary_emb_base, not rope_theta
        assert cfg["rotary_emb_base"] == 50000 and "rope_theta" not in cfg
    assert cfg["rotary_pct"] == 0.25
    inv, scaling, rope_type, base = oracle(tmp_path / "out")[None]
    assert (rope_type, base) == ("yarn", 50000)
    assert torch.equal(inv, yarn_inv_freq(16, 50000, 4.0, 2048))
    assert math.isclose(scaling, yarn_attention_scaling(4.0))


def _meta_softmax_scale(folder: Path) -> float:
    """DeepseekV2Attention's softmax scale, built by transformers from the folder's config on `meta`."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention

    with torch.device("meta"):
        return DeepseekV2Attention(AutoConfig.from_pretrained(folder), layer_idx=0).scaling


@pytest.mark.parametrize("factor", [4, 8])
def test_yarn_rescale_of_deepseek_keeps_mscale_and_the_softmax_scale(factor, layouts, tmp_path):
    out = tmp_path / "out"
    r = run("yarn", layouts["deepseek-v2"], "--factor", factor, "--rescale", "-o", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    params = cfg.get("rope_parameters") or cfg["rope_scaling"]  # the form the Hub layout has (v4)
    assert (params["mscale"], params["mscale_all_dim"], params["factor"]) == (1.0, 1.0, factor)
    assert "note: kept mscale 1, mscale_all_dim 1: deepseek_v2's attention (DeepSeek's MLA)" in r.output
    want = 128 ** -0.5 * mla_softmax_multiplier(factor, 1.0)
    assert math.isclose(_meta_softmax_scale(out), want, rel_tol=1e-9)
    assert f"transformers builds softmax scale {want:.6g}" in r.output
    if factor == 4:  # the same YaRN again: the same attention as the source's
        assert math.isclose(_meta_softmax_scale(layouts["deepseek-v2"]), want, rel_tol=1e-12)
    inv, scaling, _, _ = oracle(out)[None]
    assert torch.equal(inv, yarn_inv_freq(64, 10000, float(factor), 256))
    assert math.isclose(scaling, yarn_attention_factor(float(factor), 1.0, 1.0))


def test_deepseek_rescale_to_the_same_factor_computes_the_same_log_probs(tmp_path):
    """Real tiny weights: `yarn --rescale` with the source's own factor leaves the model's output unchanged (before:
    log-probs moved by up to 0.67, the softmax scale having lost mscale_all_dim)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    src = tmp_path / "src"
    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in DEEPSEEK_V2.items()})
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(src)
    (src / "config.json").write_text(json.dumps(DEEPSEEK_V2))  # the Hub layout over what save_pretrained wrote
    assert run("yarn", src, "--factor", 4, "--rescale", "-o", tmp_path / "out").exit_code == 0
    ids = torch.randint(3, 1000, (1, 600))  # past the original length 256
    logits = [AutoModelForCausalLM.from_pretrained(p).eval()(ids).logits.log_softmax(-1)
              for p in (src, tmp_path / "out")]
    assert torch.equal(logits[0], logits[1])
    dropped = json.loads((tmp_path / "out" / "config.json").read_text())
    for key in ("mscale", "mscale_all_dim"):  # what `yarn` wrote before issue 30
        del (dropped.get("rope_parameters") or dropped["rope_scaling"])[key]
    (tmp_path / "out" / "config.json").write_text(json.dumps(dropped))
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()(ids).logits.log_softmax(-1)
    assert (other - logits[0]).abs().max() > 1e-3  # the test can fail


def test_qwen2_moe_as_transformers_saves_it_goes_through_info_and_yarn(layouts, tmp_path):
    cfg = json.loads((layouts["qwen2-moe"] / "config.json").read_text())
    assert (cfg["sliding_window"], cfg["use_sliding_window"]) == (0, False)  # what transformers 5.19 writes
    assert info(layouts["qwen2-moe"])["sliding_window"] is None
    r = run("yarn", layouts["qwen2-moe"], "--factor", 2, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    inv, _, rope_type, _ = oracle(tmp_path / "out")[None]
    assert rope_type == "yarn" and torch.equal(inv, yarn_inv_freq(64, 10000.0, 2.0, 2048))


def test_a_config_with_transformers_encoded_infinity_goes_through_info_and_yarn(tmp_path):
    """transformers 5.19 saves an infinite float as {"__float__": "Infinity"} (Bamba's time_step_limit) and decodes
    it when it reads the file; the dict longctx builds configs from is decoded the same way."""
    src = _saved_by_transformers(
        tmp_path / "bamba", "BambaConfig", vocab_size=1000, hidden_size=256, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8,
        mamba_d_head=64, mamba_d_state=16, mamba_n_groups=1, max_position_embeddings=2048)
    assert json.loads((src / "config.json").read_text())["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert info(src)["rope_type"] == "default"
    r = run("yarn", src, "--factor", 2, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"


@pytest.mark.parametrize("values,ok", [({"sliding_window": 0}, True), ({"sliding_window": None}, True),
                                       ({"sliding_window": 0, "use_sliding_window": False}, True),
                                       ({"sliding_window": "x", "use_sliding_window": False}, True),
                                       ({"sliding_window": -1}, False), ({"sliding_window": "x"}, False)])
def test_a_switched_off_or_zero_window_is_accepted(values, ok):
    from longctx.checkpoint.config_keys import check_config_types

    if ok:
        check_config_types(values)
    else:
        with pytest.raises(InputError, match="sliding_window must be a whole number >= 0"):
            check_config_types(values)


def test_yarn_on_cohere2_says_it_cannot_reach_the_full_layers(layouts, tmp_path):
    r = run("yarn", layouts["cohere2"], "--factor", 4, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "note: YaRN cannot reach the full-attention layers (1 of 4): they use no RoPE" in r.output
    inv, _, rope_type, _ = oracle(tmp_path / "out")[None]
    assert rope_type == "yarn" and torch.equal(inv, yarn_inv_freq(64, 50000, 4.0, 2048))


# --- the library API the architecture matrix uses ----------------------------------------------------------------


def test_built_rope_and_read_rope_layers_agree_with_the_oracle(layouts):
    from longctx.checkpoint.load import model_config
    from longctx.rope.built import built_rope
    from longctx.rope.layers import read_rope_layers

    for name in ("gemma3-hub", "gemma3-v5"):
        cfg = json.loads((layouts[name] / "config.json").read_text())
        config = model_config(layouts[name])
        layers = read_rope_layers(cfg, config)
        assert layers.form == ("v4" if name == "gemma3-hub" else "v5") and layers.long_types == ["full_attention"]
        assert {lt: (r.rope_type, r.theta, r.factor) for lt, r in layers.types.items()} == {
            "full_attention": ("linear", 1e6, 8.0), "sliding_attention": ("default", 1e4, None)}
        built = built_rope(config)
        for lt, (inv, scaling, _, _) in oracle(layouts[name]).items():
            assert torch.equal(built[lt].inv_freq, inv) and built[lt].attention_scaling == scaling
    assert read_rope_layers(PYTHIA, model_config(layouts["pythia"])) is None  # one RoPE for every layer


# --- extend: per-layer bases, checked before the first step ------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_weights(tmp_path_factory, reference_tokenizer_dir):
    """{form: a tiny Gemma-3 with weights and the reference tokenizer, its config in that form}."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, GenerationConfig

    root = tmp_path_factory.mktemp("gemma3")
    values = {k: v for k, v in GEMMA3_HUB.items() if k not in ("model_type", "transformers_version")}
    values["vocab_size"] = 32000
    out = {}
    for form in ("hub", "v5"):
        path = root / form
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(Gemma3TextConfig(**values), dtype=torch.float32).save_pretrained(path)
        GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(path)
        for f in Path(reference_tokenizer_dir).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy2(f, path / f.name)
        if form == "hub":
            (path / "config.json").write_text(json.dumps({**GEMMA3_HUB, "vocab_size": 32000}))
        out[form] = path
    return out


def _extend(src: Path, out: Path, tmp_path: Path, base="2e6"):
    return run("extend", src, "--rope-base", base, "--seq-len", 512, "--data", "synthetic:mixed", "--steps", 1,
               "--tokens-per-step", 512, "--cache-dir", tmp_path / "cache", "-o", out)


@pytest.mark.parametrize("form", ["hub", "v5"])
@pytest.mark.slow
def test_extend_gemma3_rebases_the_global_layers_only_and_keeps_the_form(form, gemma3_weights, tmp_path):
    r = _extend(gemma3_weights[form], tmp_path / "ext", tmp_path)
    assert r.exit_code == 0, r.output
    assert "the sliding_attention layers (5 of 6) keep their RoPE (default, base 10000)" in r.output
    cfg = json.loads((tmp_path / "ext" / "config.json").read_text())
    if form == "hub":
        assert (cfg["rope_theta"], cfg["rope_local_base_freq"], cfg["rope_scaling"]) == (
            2000000, 1e4, {"rope_type": "linear", "factor": 8.0})
    else:
        assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 2000000
    truth = oracle(tmp_path / "ext")
    assert truth["full_attention"][2:] == ("linear", 2e6)
    assert torch.equal(truth["full_attention"][0], default_inv_freq(64, 2e6) / 8)
    assert truth["sliding_attention"][2:] == ("default", 1e4)


def test_extend_refuses_what_it_cannot_write_before_the_first_step(gemma3_weights, tmp_path):
    """Gemma-3 whose global layers are YaRN-scaled: refused in the checks before any work, no work folder left."""
    yarned = tmp_path / "yarned"
    _yarn(gemma3_weights["hub"], yarned)
    work = tmp_path / "runs"
    work.mkdir()
    r = _extend(yarned, work / "ext", tmp_path)
    one_line_exit_2(r, "the RoPE of the full_attention layers is YaRN-scaled (factor 4 from original length 256)")
    assert list(work.iterdir()) == []


def test_extend_checks_the_built_module_before_training(gemma3_weights):
    """The check `extend` runs before training is on the rotary module: the flat base change the old `extend`
    wrote for Gemma-3 (which trained with the old base) is refused by it."""
    from longctx.rope.config import check_written_rope, set_rope_base

    cfg = json.loads((gemma3_weights["hub"] / "config.json").read_text())
    flat, asked = set_rope_base(cfg, 2e6, 512, "v5")
    with pytest.raises(InputError, match="the model transformers builds from it computes .*full_attention layers: "
                                         "inv_freq"):
        check_written_rope(flat, asked)


def test_extend_says_the_new_base_cannot_reach_cohere2_full_layers(layouts, reference_tokenizer_dir, tmp_path):
    import contextlib

    from transformers import AutoConfig, AutoModelForCausalLM

    from longctx.extend.loop import _validate
    from longctx.extend.settings import ExtendSettings

    src = tmp_path / "cohere2"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(layouts["cohere2"])).save_pretrained(src)
    shutil.copy2(layouts["cohere2"] / "config.json", src / "config.json")  # the Hub layout, not transformers'
    for f in Path(reference_tokenizer_dir).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, src / f.name)
    s = ExtendSettings(checkpoint=str(src), output=str(tmp_path / "out"), seq_len=512, rope_base=1e6,
                       data=["synthetic:mixed"], steps=1, cache_dir=str(tmp_path / "cache"))
    with contextlib.ExitStack() as held:
        _, new_cfg, notes = _validate(s, 1, False, held)
    assert "the new base cannot reach the full-attention layers (1 of 4): they use no RoPE" in notes
    assert (new_cfg["rope_theta"], new_cfg["rope_scaling"]) == (1000000, None)  # the Hub layout's form (v4)


# --- ruler's suggested command names the Hub id --------------------------------------------------------------------


@pytest.mark.parametrize("at_main", [True, False])
def test_suggested_yarn_command_names_the_hub_id(at_main, tmp_path):
    from longctx.rope.config import read_rope
    from longctx.rope.settings import check_context

    commit = "a" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = _folder(repo / "snapshots" / commit, PYTHIA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit if at_main else "b" * 40)
    name = "org/tiny" if at_main else f"org/tiny@{commit}"
    with pytest.raises(InputError) as e:
        check_context(snapshot, read_rope(PYTHIA), 5000)
    assert str(e.value).endswith(f"extend it first: longctx yarn {name} --factor 4")
    assert f"beyond what '{name}' can do" in str(e.value) and str(tmp_path) not in str(e.value)
