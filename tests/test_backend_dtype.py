"""`--dtype auto` is the checkpoint's dtype (its config's, float32 when it names none) on every backend that
loads weights itself, resolved before any engine starts: what the help says, and what a run is bound to."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from longctx.eval.backends import BackendContext, registry, run_dtype

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny-gated"  # config dtype bfloat16


def _checkpoint(tmp_path, dtype):
    ckpt = tmp_path / f"ckpt-{dtype}"
    shutil.copytree(SHIPPED, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    if dtype is None:
        cfg.pop("dtype", None)
    else:
        cfg["dtype"] = dtype
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


@pytest.mark.slow
@pytest.mark.parametrize("config_dtype, want", [("bfloat16", "bfloat16"), ("float32", "float32"),
                                                (None, "float32"), ("float16", "float16")])
def test_auto_is_the_checkpoints_dtype_on_every_backend_that_loads_weights(tmp_path, config_dtype, want):
    ckpt = _checkpoint(tmp_path, config_dtype)
    assert run_dtype(None, ckpt) == run_dtype("auto", ckpt) == want
    assert run_dtype("float16", ckpt) == "float16"  # a dtype given is kept
    loading = {name: cls for name, cls in registry().items()
               if "dtype" in {f.name for f in dataclasses.fields(cls.Options)}}
    assert {"vllm", "hf"} <= loading.keys()
    for name, cls in loading.items():
        for asked in (None, "auto"):
            options = cls.Options(dtype=asked)
            backend = cls.create(options, BackendContext(str(ckpt), str(ckpt), 512))
            assert backend.binding()["dtype"] == want, (name, asked)
