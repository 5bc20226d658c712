"""`longctx yarn` on checkpoints that already have a RoPE scaling, and on architectures whose transformers config
class rewrites the RoPE type (Phi-3: YaRN in LongRoPE form); every written config built back by transformers.

References (transformers 5.19): `modeling_rope_utils.py` (`standardize_rope_params`, `_compute_longrope_parameters`,
`_compute_dynamic_ntk_parameters`), `models/phi3/configuration_phi3.py` (`convert_rope_params_to_dict` turns
"yarn" into "longrope"; `validate_rope`). vLLM 0.32: `rotary_embedding/phi3_long_rope_scaled_rope.py`.
The vLLM side (cos/sin caches and prompt log-probs) is in tests/test_yarn_vllm.py.
"""

import json
import math
import shlex

import pytest
import torch
from click.testing import CliRunner
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.rope.config import check_written_rope, read_rope, write_rope
from longctx.rope.reference import (
    longrope_inv_freq,
    yarn_attention_scaling,
    yarn_extrapolation_share,
    yarn_inv_freq,
    yarn_longrope_factors,
)
from longctx.rope.settings import check_context, yarn_command
from longctx.yarn import scaling
from longctx.yarn.scaling import apply_yarn, vllm_settings

_SHAPE = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
LLAMA = {**_SHAPE, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
         "rope_theta": 10000.0, "rope_scaling": None}
# Llama 3.1 as released: llama3 scaling from 8192 to 131072
LLAMA3 = {**LLAMA, "max_position_embeddings": 131072, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}
YARN = {**LLAMA, "max_position_embeddings": 16384,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}
# lmsys/vicuna-7b-v1.5-16k: max_position_embeddings 4096 before the linear factor 4 (nothing records which)
LINEAR = {**LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}}
LINEAR_RECORDED = {**LLAMA, "max_position_embeddings": 16384, "original_max_position_embeddings": 4096,
                   "rope_scaling": {"type": "linear", "factor": 4.0}}
DYNAMIC = {**LLAMA, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
PHI3 = {**_SHAPE, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None}
# Phi-3-mini-128k's shape of config: LongRoPE without `factor`, the original length top-level only
LONGROPE = {**PHI3, "max_position_embeddings": 131072,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [1.5] * 32}}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _rope(cfg):
    r = read_rope(cfg)
    return r.rope_type, r.factor, r.original_max_position_embeddings, r.max_position_embeddings, r.context_length


# --- the original length of every scaling -----------------------------------------------------------


@pytest.mark.parametrize("cfg,trained", [(LLAMA, 4096), (YARN, 4096), (LLAMA3, 8192), (LINEAR, None),
                                         (LINEAR_RECORDED, 4096), (DYNAMIC, 4096), (LONGROPE, 4096),
                                         ({**DYNAMIC, "original_max_position_embeddings": 2048}, 2048),
                                         ({**LONGROPE, "original_max_position_embeddings": None}, 4096)])
def test_trained_length_is_the_original_yarn_uses(cfg, trained):
    """The last row: Phi3Config's own original_max_position_embeddings (default 4096) wins as in transformers."""
    assert read_rope(cfg).trained_length == trained
    if trained is not None:
        assert apply_yarn(cfg, 2.0, rescale=True).rope.original_max_position_embeddings == trained


def test_dynamic_original_is_what_transformers_scales_from():
    """transformers' dynamic NTK leaves the base alone up to max_position_embeddings: that is the original."""
    from transformers import LlamaConfig

    hf = LlamaConfig(**{k: v for k, v in DYNAMIC.items() if k not in ("model_type", "rope_scaling")},
                     rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    at_max, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=4096)
    beyond, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=4097)
    default = 1.0 / 1e4 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    assert torch.equal(at_max, default) and not torch.equal(beyond, default)


# --- refusals without --rescale ---------------------------------------------------------------------


RESCALE = "; pass --rescale to replace its scaling with YaRN from the original length"


@pytest.mark.parametrize("cfg,message", [
    (YARN, "checkpoint is already YaRN-scaled (factor 4, original length 4096)" + RESCALE),
    (LLAMA3, "checkpoint is already llama3-scaled (factor 8, original length 8192)" + RESCALE),
    (DYNAMIC, "checkpoint is already dynamic NTK-scaled (factor 2, original length 4096)" + RESCALE),
    (LINEAR_RECORDED, "checkpoint is already linear-scaled (factor 4, original length 4096)" + RESCALE),
    (LONGROPE, "checkpoint is already LongRoPE-scaled (factor 32, original length 4096)" + RESCALE),
    (LINEAR, ("checkpoint is already linear-scaled (factor 4) and its config does not record the original length "
              "(max_position_embeddings 4096 may count before or after the factor); pass --rescale "
              "--original-max-position-embeddings N, N the length it was trained at before the linear scaling")),
])
def test_scaled_checkpoint_without_rescale_is_one_line(cfg, message):
    with pytest.raises(InputError) as e:
        apply_yarn(cfg, 2.0)
    assert str(e.value) == message


def test_linear_needs_the_original_length():
    with pytest.raises(InputError) as e:
        apply_yarn(LINEAR, 2.0, rescale=True)
    assert str(e.value) == (
        "linear RoPE scaling (factor 4) does not record the original length (max_position_embeddings 4096 may count "
        "before or after the factor); pass --original-max-position-embeddings N, N the length the model was trained "
        "at before the linear scaling")
    # togethercomputer/LLaMA-2-7B-32K counts after the factor: 32768 with linear 8 means 4096 before it
    res = apply_yarn({**LINEAR, "max_position_embeddings": 32768, "rope_scaling": {"type": "linear", "factor": 8.0}},
                     8.0, original=4096, rescale=True)
    assert _rope(res.config) == ("yarn", 8.0, 4096, 32768, 32768)


# --- --rescale: what is kept, what is dropped, and the notes ---------------------------------------------


@pytest.mark.parametrize("cfg,note", [
    (LLAMA3, "replaced llama3 scaling (factor 8, original length 8192) with YaRN from original length 8192; "
             + "dropped low_freq_factor, high_freq_factor (llama3's own parameters, unused by YaRN)"),
    (DYNAMIC, "replaced dynamic NTK scaling (factor 2, original length 4096) with YaRN from original length 4096"),
    (LINEAR_RECORDED, "replaced linear scaling (factor 4, original length 4096) with YaRN from original length 4096"),
])
def test_rescale_replaces_the_scaling_keeps_the_base(cfg, note, tmp_path):
    res = apply_yarn(cfg, 16.0, rescale=True, config_format="v5")
    assert res.notes == [note]
    n = read_rope(cfg).trained_length
    assert res.config["rope_parameters"] == {"rope_type": "yarn", "rope_theta": read_rope(cfg).theta, "factor": 16.0,
                                             "original_max_position_embeddings": n}
    assert res.config["max_position_embeddings"] == 16 * n and "rope_scaling" not in res.config
    assert "original_max_position_embeddings" not in res.config  # LlamaConfig has no such field
    (tmp_path / "config.json").write_text(json.dumps(res.config))
    check_written_rope(tmp_path, res.rope)  # transformers reads exactly this


def test_rescale_longrope_to_yarn_in_longrope_form():
    res = apply_yarn(LONGROPE, 8.0, rescale=True, config_format="v5")
    assert res.notes[0] == ("replaced LongRoPE scaling (factor 32, original length 4096) with YaRN from original "
                            "length 4096; dropped short_factor, long_factor (LongRoPE's own parameters, unused by "
                            "YaRN)")
    assert _rope(res.config) == ("yarn", 8.0, 4096, 32768, 32768)
    assert res.config["rope_parameters"]["long_factor"] == yarn_longrope_factors(64, 10000, 8.0, 4096)


def test_rescale_keeps_partial_rotary_factor_and_drops_engine_dependent_keys():
    cfg = {**LLAMA3, "rope_scaling": {**LLAMA3["rope_scaling"], "partial_rotary_factor": 0.5}}
    assert apply_yarn(cfg, 4.0, rescale=True, config_format="v5").config["rope_parameters"]["partial_rotary_factor"] == 0.5
    yarn = {**YARN, "rope_scaling": {**YARN["rope_scaling"], "mscale": 1.0, "beta_fast": 16.0}}
    res = apply_yarn(yarn, 2.0, rescale=True, config_format="v5")
    assert res.notes == ["dropped mscale: transformers and vLLM versions disagree on their meaning"]
    assert res.config["rope_parameters"]["beta_fast"] == 16.0  # YaRN's own keys stay


# --- check_context suggests a command that runs ---------------------------------------------------------


@pytest.mark.parametrize("name,cfg,longest,expected", [
    ("default", LLAMA, 10000, "--factor 4"),
    ("yarn", YARN, 20000, "--factor 8 --rescale"),
    ("llama3", LLAMA3, 200000, "--factor 32 --rescale"),
    ("linear", LINEAR, 10000, "--factor 4 --rescale --original-max-position-embeddings 4096"),
    ("linear-recorded", LINEAR_RECORDED, 20000, "--factor 8 --rescale"),
    ("dynamic", DYNAMIC, 5000, "--factor 2 --rescale"),
    ("longrope", LONGROPE, 140000, "--factor 64 --rescale"),
])
def test_check_context_suggestion_runs_and_covers_the_length(name, cfg, longest, expected, tmp_path):
    ckpt = tmp_path / name
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as e:
        check_context(ckpt, read_rope(cfg), longest)
    command = str(e.value).split("extend it first: ", 1)[1]
    assert command == yarn_command(ckpt, read_rope(cfg), longest) == f"longctx yarn {ckpt} {expected}"
    words = shlex.split(command)
    assert words[:2] == ["longctx", "yarn"]
    r = run(*words[1:], "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    written = read_rope(json.loads((tmp_path / "out" / "config.json").read_text()))
    assert written.rope_type == "yarn" and written.context_length >= longest
    check_context(tmp_path / "out", written, longest)  # and now it fits


# --- check_written_rope ----------------------------------------------------------------------------------


def test_check_written_rope_accepts_what_transformers_reads_and_names_what_differs(tmp_path):
    res = apply_yarn(LLAMA, 4.0, config_format="v5")
    check_written_rope(res.config, res.rope, "out/config.json")
    (tmp_path / "config.json").write_text(json.dumps(res.config))
    check_written_rope(tmp_path, res.rope)
    asked = read_rope({**res.config, "max_position_embeddings": 8192,
                       "rope_parameters": {**res.config["rope_parameters"], "factor": 2.0}})
    with pytest.raises(InputError) as e:
        check_written_rope(tmp_path, asked)
    assert str(e.value) == (f"'{tmp_path / 'config.json'}': transformers' LlamaConfig reads factor 4.0 (written 2.0), "
                            "max_position_embeddings 16384 (written 8192); longctx cannot write this RoPE for "
                            "model_type 'llama'")


def test_check_written_rope_catches_a_config_class_that_rewrites_the_type():
    """Plain YaRN for Phi-3: Phi3Config makes it "longrope" and then misses the LongRoPE factors."""
    plain = write_rope(PHI3, read_rope(apply_yarn(LLAMA, 4.0).config))
    with pytest.raises(InputError) as e:
        check_written_rope(plain, read_rope(plain), "out/config.json")
    assert str(e.value).startswith("'out/config.json': transformers cannot build a config from what longctx wrote (")
    assert "short_factor" in str(e.value) and str(e.value).endswith("longctx cannot write this RoPE for model_type "
                                                                    "'phi3'")
    # Phi3Config's top-level original_max_position_embeddings (default 4096) wins over the RoPE dict's
    form = apply_yarn({**PHI3, "max_position_embeddings": 256, "original_max_position_embeddings": 256}, 4.0)
    assert form.config["original_max_position_embeddings"] == 256
    without = {k: v for k, v in form.config.items() if k != "original_max_position_embeddings"}
    with pytest.raises(InputError, match=r"Phi3Config reads original length 4096 \(written 256\)"):
        check_written_rope(without, form.rope)
    with pytest.raises(InputError, match="cannot build a config.*model_type 'wibble'"):
        check_written_rope({**LLAMA, "model_type": "wibble"}, read_rope(LLAMA))


def test_check_written_rope_passes_on_the_refusal_to_run_shipped_code(tmp_path):
    cfg = {**LLAMA, "model_type": "custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    with pytest.raises(InputError, match="--trust-remote-code") as e:
        check_written_rope(cfg, read_rope(LLAMA), checkpoint=tmp_path)
    assert str(e.value).startswith(f"'{tmp_path}'") and "longctx wrote" not in str(e.value)


def test_architecture_that_cannot_hold_yarn_is_refused(monkeypatch):
    monkeypatch.setattr(scaling, "YARN_AS_LONGROPE", ())
    with pytest.raises(InputError, match="^'config.json': transformers cannot build a config from what longctx "
                                         "wrote .*; longctx cannot write this RoPE for model_type 'phi3'$"):
        apply_yarn(PHI3, 4.0)


def test_phi3_whose_head_dim_is_not_hidden_over_heads_is_refused():
    cfg = {**PHI3, "hidden_size": 128}  # Phi3Config sizes the factors by 128 / 4 = 32, the model rotates 64
    with pytest.raises(InputError) as e:
        apply_yarn(cfg, 4.0, label="out/config.json")
    assert str(e.value) == ("'out/config.json': transformers' phi3 config class sizes LongRoPE factors by hidden_size "
                            "/ num_attention_heads (32) but the model rotates head_dim 64, so no YaRN config (LongRoPE "
                            "form) of this checkpoint loads in transformers")


# --- YaRN in LongRoPE form ----------------------------------------------------------------------------------


def test_yarn_longrope_factors_are_yarn_frequencies():
    dim, base, s, n = 96, 1e4, 4.0, 4096  # Phi-3-mini's head
    f = torch.tensor(yarn_longrope_factors(dim, base, s, n), dtype=torch.float64)
    keep = yarn_extrapolation_share(dim, base, n).double()
    assert torch.equal(f[keep == 1], torch.ones(int((keep == 1).sum()), dtype=torch.float64))  # extrapolated
    assert torch.equal(f[keep == 0], torch.full((int((keep == 0).sum()),), s, dtype=torch.float64))  # interpolated
    torch.testing.assert_close(1 / f, (1 - keep) / s + keep, rtol=1e-7, atol=0)  # the blend, as fp32 numbers
    ours, yarn = longrope_inv_freq(f.tolist(), dim, base), yarn_inv_freq(dim, base, s, n)
    ulp = torch.finfo(torch.float32).eps
    assert ((ours - yarn).abs() / yarn).max().item() <= ulp  # 1 ulp at most, on the ramp only
    assert int((ours == yarn).sum()) >= 43  # and most pairs bit for bit (43 of 48 here)


def test_transformers_longrope_of_the_form_is_the_longrope_reference():
    from transformers import AutoConfig

    res = apply_yarn(PHI3, 4.0, config_format="v5")
    hf = AutoConfig.for_model("phi3", **{k: v for k, v in res.config.items() if k != "model_type"})
    factors = res.config["rope_parameters"]["long_factor"]
    want = longrope_inv_freq(factors, 64, 10000)
    for seq_len in (None, 4096, 4097):  # short factors up to the original length, long beyond: the same
        inv, scale = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq_len)
        assert torch.equal(inv, want) and scale == yarn_attention_scaling(4.0)


def test_phi3_yarn_is_written_as_longrope_and_read_back_as_yarn(tmp_path):
    res = apply_yarn(PHI3, 4.0, label="out/config.json", config_format="v5")
    factors = yarn_longrope_factors(64, 10000, 4.0, 4096)
    scale = yarn_attention_scaling(4.0)
    assert res.config["rope_parameters"] == {
        "rope_type": "longrope", "rope_theta": 10000, "factor": 4.0, "original_max_position_embeddings": 4096,
        "short_factor": factors, "long_factor": factors, "attention_factor": scale, "short_mscale": scale,
        "long_mscale": scale}
    assert res.config["max_position_embeddings"] == 16384 and res.config["original_max_position_embeddings"] == 4096
    assert "rope_scaling" not in res.config and "rope_theta" not in res.config
    assert res.notes == [("transformers' phi3 config class does not keep rope_type 'yarn', so YaRN is written as "
                          "LongRoPE: short_factor = long_factor = YaRN's per-pair factors, attention_factor = "
                          "short_mscale = long_mscale = YaRN's attention scale (longctx reads it back as YaRN)")]
    back = read_rope(res.config)
    assert (back.rope_type, back.stored_type, back.factor, back.original_max_position_embeddings,
            back.context_length, back.trained_length) == ("yarn", "longrope", 4.0, 4096, 16384, 4096)
    assert back == res.rope and write_rope(PHI3, back, "v5") == res.config  # round trip
    # the v4 format says the same
    v4 = apply_yarn(PHI3, 4.0, config_format="v4").config
    assert v4["rope_scaling"]["rope_type"] == "longrope" and read_rope(v4).rope_type == "yarn"
    # `longctx info` says what it is
    (tmp_path / "config.json").write_text(json.dumps(res.config))
    from longctx.info.describe import describe

    d = describe(tmp_path)
    assert (d.rope_type, d.yarn_factor, d.original_max_position_embeddings, d.context_length) == ("yarn", 4.0, 4096,
                                                                                                 16384)


def test_longrope_form_recognised_only_when_it_is_yarn():
    res = apply_yarn(PHI3, 4.0, beta_fast=16, config_format="v5")
    assert read_rope(res.config).extra["beta_fast"] == 16.0 and read_rope(res.config).rope_type == "yarn"
    params = res.config["rope_parameters"]

    def variant(**changes):
        return read_rope({**res.config, "rope_parameters": {**params, **changes}}).rope_type

    bent = list(params["long_factor"])
    bent[5] *= 1.01
    assert variant(long_factor=bent, short_factor=bent) == "longrope"
    assert variant(long_factor=bent) == "longrope"  # short != long: not one RoPE at every length
    assert variant(beta_fast=32.0) == "longrope"  # the factors are for beta_fast 16
    assert variant(short_mscale=1.0) == "longrope"  # vLLM would scale attention differently
    assert read_rope({**res.config, "max_position_embeddings": 8192}).rope_type == "longrope"
    assert read_rope(LONGROPE).rope_type == "longrope"


def test_rescale_of_longrope_form_writes_it_again_without_notes_about_its_keys():
    once = apply_yarn(PHI3, 4.0, config_format="v5").config
    with pytest.raises(InputError, match="already YaRN-scaled"):
        apply_yarn(once, 8.0, config_format="v5")
    again = apply_yarn(once, 8.0, rescale=True, config_format="v5")
    assert _rope(again.config) == ("yarn", 8.0, 4096, 32768, 32768)
    assert not any("dropped" in note for note in again.notes)
    assert again.config["rope_parameters"]["long_factor"] == yarn_longrope_factors(64, 10000, 8.0, 4096)


def test_vllm_settings_of_the_longrope_form_are_the_written_config():
    res = apply_yarn(PHI3, 4.0, config_format="v5")
    s = vllm_settings(res.rope)
    assert s["max_model_len"] == 16384
    assert s["hf_overrides"] == {"rope_parameters": res.config["rope_parameters"], "max_position_embeddings": 16384,
                                 "original_max_position_embeddings": 4096}


def test_phimoe_gets_the_longrope_form_too():
    cfg = {**_SHAPE, "model_type": "phimoe", "max_position_embeddings": 4096, "rope_theta": 1e6,
           "num_local_experts": 2, "rope_scaling": None}
    res = apply_yarn(cfg, 4.0, config_format="v5")
    assert res.config["rope_parameters"]["rope_type"] == "longrope" and read_rope(res.config).rope_type == "yarn"
    assert math.isclose(res.config["rope_parameters"]["long_mscale"], yarn_attention_scaling(4.0))


def test_cli_yarn_on_scaled_checkpoints(tmp_path):
    src = tmp_path / "llama3"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(LLAMA3))
    r = run("yarn", src, "--factor", "16")
    assert r.exit_code == 2 and "already llama3-scaled (factor 8, original length 8192); pass --rescale" in r.output
    r = run("yarn", src, "--factor", "16", "--rescale", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "note: replaced llama3 scaling" in r.output and "context length: 131072 tokens" in r.output
    assert "Replace the checkpoint's RoPE scaling (yarn, llama3, linear, dynamic, longrope) with YaRN from its" in \
        " ".join(run("yarn", "--help").output.split())


# --- refusals come alone ----------------------------------------------------------------------------------------

# microsoft/Phi-3.5-mini-instruct and Phi-4-mini-instruct as shipped (shrunk): LongRoPE without `factor`, its
# original length top-level; Phi-4-mini rotates 3/4 of each head. transformers warns about such a config when it
# builds one (`rope_parameters['original_max_position_embeddings']`...), which came before the refusals below.
PHI35 = {**LONGROPE, "head_dim": None, "num_key_value_heads": 4, "sliding_window": 262144, "pad_token_id": 0}
PHI4 = {**LONGROPE, "head_dim": None, "partial_rotary_factor": 0.75, "pad_token_id": 0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 24, "long_factor": [1.5] * 24}}


@pytest.mark.parametrize("cfg", [PHI35, PHI4], ids=["phi-3.5", "phi-4"])
@pytest.mark.parametrize("verb,remedy", [
    (["yarn", "--factor", "2"], "pass --rescale"),
    (["extend", "--rope-base", "1e6", "--seq-len", "8k", "--data", "synthetic:mixed", "--steps", "1"],
     "scale the result with longctx yarn"),
], ids=["yarn", "extend"])
def test_a_refusal_is_the_only_thing_the_command_says(cfg, verb, remedy, tmp_path):
    """Exit 2 and one line that says what the checkpoint has and what to run; transformers logs nothing and
    Python warns nothing before it (a handler on transformers' logger sees what its own handler would print)."""
    import logging
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    ckpt = tmp_path / "phi"
    shown = {k: v for k, v in cfg.items() if v is not None}
    config = AutoConfig.for_model("phi3", **{k: v for k, v in shown.items() if k != "model_type"})
    AutoModelForCausalLM.from_config(config).save_pretrained(ckpt)
    (ckpt / "config.json").write_text(json.dumps(shown))

    logged: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # the checkpoint made above has said its warnings once already
    library = logging.getLogger("transformers")
    handler = Seen(logging.DEBUG)
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            r = run(*verb[:1], ckpt, *verb[1:], "-o", tmp_path / "out")
    finally:
        library.removeHandler(handler)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert ("LongRoPE-scaled" in r.output or "'longrope'" in r.output) and remedy in r.output, r.output
    assert not [m for m in logged if m], logged
    assert not warned, [str(w.message) for w in warned]
    assert not (tmp_path / "out").exists()
