"""A RoPE type is one record (`longctx.rope.types`): a made-up type, registered there and in transformers'
`ROPE_INIT_FUNCTIONS` (where every model's rotary module looks up its initialiser), goes through `info`, `yarn`
and `extend`'s base change with nothing else of longctx changed; without its record it is refused."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.rope import types as rope_types

TRAINED = 256


def _halved_freqs(base: float, dim: int):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)) / 2


def _transformers_init(config, device=None, seq_len=None, layer_type=None):
    """The made-up type as transformers' initialisers are written (`_compute_linear_scaling_rope_parameters`)."""
    config.standardize_rope_params()
    params = config.rope_parameters[layer_type] if layer_type else config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return _halved_freqs(params["rope_theta"], head_dim).to(device), float(params.get("scale", 1.0))


HALVED = rope_types.RopeType(
    "halved", "halved", lambda params, dim, max_pos: (_halved_freqs(params["rope_theta"], dim),
                                                      float(params.get("scale", 1.0))),
    original="recorded", trained_from="original")


@pytest.fixture
def halved_checkpoint(tmp_path, reference_tokenizer_dir, monkeypatch):
    """A tiny Llama whose RoPE is the made-up type 'halved' (every frequency halved, cos and sin times
    `scale`), scaled from a recorded original length of 256 to 512; the type known to transformers."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "halved", _transformers_init)
    rope = {"rope_type": "halved", "rope_theta": 10000.0, "factor": 2.0, "scale": 1.25,
            "original_max_position_embeddings": TRAINED}
    config = LlamaConfig(vocab_size=32000, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2 * TRAINED,
                         rope_parameters=rope)
    out = tmp_path / "halved"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "halved"
    for f in reference_tokenizer_dir.iterdir():
        shutil.copy2(f, out / f.name)
    return out


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_type_without_a_record_is_refused_by_what_would_change_it(halved_checkpoint, tmp_path):
    r = run("yarn", halved_checkpoint, "--factor", 4, "--rescale", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "unknown RoPE type 'halved'" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_a_registered_type_goes_through_info_yarn_and_extend(halved_checkpoint, tmp_path, monkeypatch):
    from longctx.extend.loop import _validate
    from longctx.extend.settings import ExtendSettings

    monkeypatch.setitem(rope_types.ROPE_TYPES, "halved", HALVED)
    info = json.loads(run("info", halved_checkpoint, "--json").output)
    built = info["rope_layers"]["full_attention"]
    assert (info["rope_type"], info["context_length"]) == ("halved", 2 * TRAINED)
    assert (built["rope_type"], built["base"], built["attention_scaling"]) == ("halved", 10000.0, 1.25)

    r = run("yarn", halved_checkpoint, "--factor", 4, "--rescale", "-o", tmp_path / "yarn")
    assert r.exit_code == 0, r.output
    assert f"replaced halved scaling (factor 2, original length {TRAINED}) with YaRN from original length " \
           f"{TRAINED}; dropped scale" in r.output, r.output
    written = json.loads((tmp_path / "yarn" / "config.json").read_text())["rope_parameters"]
    assert written == {"rope_type": "yarn", "rope_theta": 10000, "factor": 4.0,
                       "original_max_position_embeddings": TRAINED}

    # a new base keeps the type under it; the check before training holds transformers' module to the record's
    # reference
    s = ExtendSettings(checkpoint=str(halved_checkpoint), output=str(tmp_path / "ext"), seq_len=4 * TRAINED,
                       rope_base=1e6, data=["synthetic:mixed"], steps=1, cache_dir=str(tmp_path / "cache"))
    with contextlib.ExitStack() as held:
        _, new_cfg, _ = _validate(s, 1, False, held)
    assert new_cfg["rope_parameters"] == {"rope_type": "halved", "rope_theta": 1000000, "factor": 2.0,
                                          "original_max_position_embeddings": TRAINED, "scale": 1.25}


def test_the_check_holds_the_module_to_the_record(halved_checkpoint, monkeypatch):
    """A record whose reference is not what transformers' initialiser computes is caught by the written-RoPE
    check (the reference is the check's, not a copy of the module)."""
    from longctx.core.errors import InputError
    from longctx.rope.config import check_written_rope, read_rope

    wrong = rope_types.RopeType("halved", "halved", lambda params, dim, max_pos: (
        _halved_freqs(params["rope_theta"], dim) * 2, 1.25), original="recorded", trained_from="original")
    monkeypatch.setitem(rope_types.ROPE_TYPES, "halved", wrong)
    cfg = json.loads((halved_checkpoint / "config.json").read_text())
    with pytest.raises(InputError, match="inv_freq"):
        check_written_rope(cfg, read_rope(cfg))
