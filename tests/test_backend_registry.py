"""A backend is one file and one registry line (`longctx.eval.backends`): a throwaway backend, written here as a
package of its own with one entry point, gets its options on `ruler`'s command line and in recipes, is refused
where another backend is chosen, and runs `longctx ruler` end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import user_environment

from longctx.eval.backends import (
    BUILTIN_BACKENDS,
    OPTIONS_GROUP,
    Backend,
    BackendOptions,
    option_fields,
    option_users,
    registry,
)
from longctx.eval.settings import RulerRunSettings

ECHO_BACKEND = '''
"""A backend that answers every request with the same text."""
from dataclasses import dataclass

from longctx.core.kinds import Text
from longctx.core.settings import setting
from longctx.eval.backends import Backend, BackendOptions


@dataclass(frozen=True)
class EchoOptions(BackendOptions):
    answer: str = setting("none", Text(), "echo: the text every request gets.")


class EchoBackend(Backend):
    name, Options, loads_weights = "echo", EchoOptions, False

    def __init__(self, answer):
        self.answer = answer

    @classmethod
    def create(cls, options, context):
        return cls(options.answer)

    def settings(self):
        return {"name": self.name, "answer": self.answer}

    def binding(self):
        return {"answer": self.answer}

    def generate(self, requests, on_result):
        self.ran = {"device": "none"}
        for r in requests:
            on_result(r, self.answer, None)
'''


def test_every_builtin_backend_is_a_backend_with_options():
    for name in BUILTIN_BACKENDS:
        cls = registry()[name]
        assert issubclass(cls, Backend) and cls.name == name
        assert issubclass(cls.Options, BackendOptions)


def test_ruler_settings_are_every_backends_options():
    """The ruler settings hold each registered backend's options once, in the recipe group; which backend
    uses which option comes from the backends' own options types."""
    composed = {f.name: f for f in dataclasses.fields(RulerRunSettings)}
    for name, cls in registry().items():
        for f in dataclasses.fields(cls.Options):
            assert RulerRunSettings.key(f.name) == f"{OPTIONS_GROUP}.{f.name}"
            assert composed[f.name].default == f.default or composed[f.name].default_factory() == f.default_factory()
            assert name in option_users()[f.name]
    assert option_users()["dtype"] == ["vllm", "hf"]
    assert len({f[0] for f in option_fields()}) == len(option_fields())


def test_an_option_of_another_backend_is_refused_by_name():
    from longctx.core.errors import InputError

    with pytest.raises(InputError, match="--device is an option of hf, which --backend vllm does not use"):
        RulerRunSettings(checkpoint="c", output="o", lengths=[4096], device="cpu")


@pytest.mark.slow
def test_building_ruler_settings_imports_nothing_heavy():
    """The settings (and with them every backend's options) come without vLLM, torch, transformers or an HTTP
    client: `--help` and recipe loading stay fast."""
    code = ("import sys\n"
            "from longctx.eval.settings import RulerRunSettings\n"
            "RulerRunSettings(checkpoint='c', output='o', lengths=[4096], backend='openai', base_url='http://x:1/v1')\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'vllm', 'httpx', "
            "'httpcore'})\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _install_echo(root: Path) -> dict[str, str]:
    """The echo backend as an installed package would add it: its module, and one entry point."""
    root.mkdir()
    (root / "echo_backend.py").write_text(ECHO_BACKEND)
    info = root / "longctx_echo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: longctx-echo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[longctx.backends]\necho = echo_backend:EchoBackend\n")
    return {**user_environment(), "PYTHONPATH": str(root)}


def _longctx(env, *args):
    return subprocess.run([sys.executable, "-m", "longctx", *map(str, args)], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_a_backend_added_by_a_package_runs_ruler(tmp_path, reference_tokenizer_dir):
    from longctx.init.presets import write_tiny_qwen3

    ckpt = write_tiny_qwen3(tmp_path / "tiny", reference_tokenizer_dir, max_position_embeddings=2048)
    env = _install_echo(tmp_path / "site")
    help_text = _longctx(env, "ruler", "run", "--help")
    assert help_text.returncode == 0 and "--answer" in help_text.stdout and "echo" in help_text.stdout

    refused = _longctx(env, "ruler", "run", ckpt, "--lengths", "1k", "--tasks", "vt", "--answer", "x", "-o",
                       tmp_path / "no")
    assert refused.returncode == 2
    assert "--answer is an option of echo, which --backend vllm does not use" in refused.stderr
    assert not (tmp_path / "no").exists()

    run = tmp_path / "run"
    r = _longctx(env, "ruler", "run", ckpt, "--backend", "echo", "--answer", "42", "--lengths", "1k",
                 "--tasks", "niah_single_1", "--samples", "2", "--no-plot", "-o", run)
    assert r.returncode == 0, r.stderr
    scores = json.loads((run / "scores.json").read_text())
    assert scores["backend"]["name"] == "echo" and scores["backend"]["answer"] == "42"
    preds = [json.loads(line) for line in (run / "pred" / "1024" / "niah_single_1.jsonl").read_text().splitlines()]
    assert [p["pred"] for p in preds] == ["42", "42"]
    assert json.loads((run / "run.json").read_text())["binding"]["engine"] == {"answer": "42"}


@pytest.mark.slow
def test_a_package_may_not_take_a_builtin_name(tmp_path):
    site = tmp_path / "site"
    env = _install_echo(site)
    (site / "longctx_echo-0.1.dist-info" / "entry_points.txt").write_text(
        "[longctx.backends]\nvllm = echo_backend:EchoBackend\n")
    assert _longctx(env, "info", "--help").returncode == 0  # other verbs are not concerned
    r = _longctx(env, "ruler", "run", "ckpt", "--lengths", "4k", "-o", tmp_path / "run")
    assert r.returncode == 2 and r.stderr == ("Error: the package entry point longctx.backends:vllm "
                                              "(echo_backend:EchoBackend) names a backend longctx already has; "
                                              "rename it\n"), r.stderr
