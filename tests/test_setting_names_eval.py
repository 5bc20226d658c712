"""The refusals of `ruler` (its backends, its run directory, `ruler_tasks`) name a setting as whoever shows them
wrote it: `--base-url` on the command line, `ruler.backend_options.base_url` in a recipe; a Python caller of
`ruler_tasks.prepare` (which maps one to one onto `longctx ruler prepare`) reads the command line's names. The
command line's words are the ones it always showed."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.errors import SettingError
from longctx.eval.backends.openai import OpenAIBackend, OpenAIOptions
from longctx.eval.binding import RUN_FILE, RUN_FORMAT, check_run_dir
from longctx.eval.endpoint import Endpoint
from longctx.eval.settings import RulerRunSettings
from longctx.recipe.stages.ruler import RulerSection
from ruler_tasks.errors import RulerInputError
from ruler_tasks.prepare import prepare

PASSWORD = "s3cret-pw"
BOTH = f"http://alice:{PASSWORD}@127.0.0.1:9/v1"  # user info while OPENAI_API_KEY is set: refused
NO_CHAT = "chat needs a tokenizer with a chat template (this one has none); use "


def in_recipe(e: SettingError) -> str:
    """`e` as a recipe's ruler stage names it (`longctx.recipe.run._in_recipe`, `longctx.recipe.load`)."""
    return e.render(lambda n: f"ruler.{RulerSection.key(n)}")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def error_line(r) -> str:
    """The one `Error: ...` line of a refused command, without the prefix."""
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.removeprefix("Error: ").rstrip("\n")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, reference_tokenizer_dir):
    """A tiny Qwen3 whose context reaches 1k (its tokenizer has no chat template)."""
    from longctx.init.presets import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("names") / "tiny", reference_tokenizer_dir,
                            max_position_embeddings=2048)


def write_recipe(path, ckpt, ruler: dict):
    doc = {"models": {"tiny": {"checkpoint": str(ckpt)}}, "ruler": {"lengths": "1k", "tasks": "vt", "samples": 1,
                                                                    **ruler}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# --- a backend option: the openai backend's base_url ------------------------------------------------------


def test_a_base_url_refusal_names_the_option_either_way(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    with pytest.raises(SettingError) as e:
        Endpoint(BOTH, owner=OpenAIOptions)
    assert str(e.value).endswith("drop the user info from --base-url or unset OPENAI_API_KEY")
    assert str(e.value).startswith("--base-url 'http://")
    assert in_recipe(e.value).startswith("ruler.backend_options.base_url 'http://")
    assert in_recipe(e.value).endswith("drop the user info from ruler.backend_options.base_url or unset "
                                       "OPENAI_API_KEY")
    assert PASSWORD not in str(e.value) and PASSWORD not in in_recipe(e.value)


def test_an_unreachable_endpoint_names_the_option_either_way(tmp_path):
    b = OpenAIBackend("http://127.0.0.1:9/v1", checkpoint="tiny", checkpoint_dir=str(tmp_path), max_model_len=64,
                      connect_attempts=1, retry_wait=0.0)
    with pytest.raises(SettingError) as e:
        b.check()
    assert str(e.value).endswith("; start the server or fix --base-url")
    assert in_recipe(e.value).endswith("; start the server or fix ruler.backend_options.base_url")


def test_a_base_url_refusal_from_the_command_line(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    r = run("ruler", ckpt, "--lengths", "1k", "--tasks", "vt", "--samples", "1", "--backend", "openai",
            "--base-url", BOTH, "-o", tmp_path / "run")
    line = error_line(r)
    assert line.startswith("--base-url 'http://") and "holds a user name and password (basic auth)" in line
    assert line.endswith("drop the user info from --base-url or unset OPENAI_API_KEY")
    assert PASSWORD not in r.output and not (tmp_path / "run").exists()


@pytest.mark.slow  # runs a recipe's ruler stage
def test_a_base_url_refusal_in_a_recipe(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    recipe = write_recipe(tmp_path / "r.yaml", ckpt, {"backend": "openai", "backend_options": {"base_url": BOTH}})
    line = error_line(run("run", recipe, "-o", tmp_path / "out"))
    assert line.startswith(f"{recipe}: ruler for tiny: ruler.backend_options.base_url 'http://")
    assert line.endswith("drop the user info from ruler.backend_options.base_url or unset OPENAI_API_KEY")
    assert "--base-url" not in line and PASSWORD not in line


# --- the run directory's binding: the settings that differ ----------------------------------------------


def test_a_run_directory_bound_to_other_settings_names_them_either_way(tmp_path):
    bound = {"fingerprint": "f" * 64, "tokenizer": "t", "seed": 42, "samples": 3, "template": "base",
             "system_prompt": None, "chat_template_kwargs": None, "think_tokens": None, "backend": "vllm",
             "sampling": {}, "engine": {"dtype": "bfloat16", "served_model": "a", "engine_args": {"x": 1}}}
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_FILE).write_text(json.dumps({"format": RUN_FORMAT, "binding": bound, "files": {}}))
    now = {**bound, "seed": 1, "engine": {"dtype": "float32", "served_model": "b", "engine_args": {"x": 2}}}
    with pytest.raises(SettingError) as e:
        check_run_dir(out, now)
    e.value.owner = RulerRunSettings  # as `run_ruler` sets it
    changes = ('{} 42 -> 1; {} "bfloat16" -> "float32"; {} "a" -> "b"; {} x 1 -> 2; use the same settings to '
               "continue it, or another -o")
    assert str(e.value).endswith(changes.format("--seed", "--dtype", "--served-model", "--engine-arg"))
    assert in_recipe(e.value).endswith(changes.format("ruler.seed", "ruler.backend_options.dtype",
                                                      "ruler.backend_options.model",
                                                      "ruler.backend_options.engine_args"))


# --- a refusal of ruler_tasks: three ways ---------------------------------------------------------------


def test_a_ruler_tasks_refusal_called_directly_names_the_command_line_options(reference_tokenizer_dir, tmp_path):
    with pytest.raises(RulerInputError) as e:
        prepare(reference_tokenizer_dir, [1024], tasks=["vt"], template="chat", out_dir=tmp_path / "o",
                progress=False)
    assert str(e.value) == f"--template {NO_CHAT}--template base"
    assert in_recipe(e.value) == f"ruler.template {NO_CHAT}ruler.template base"
    # thinking without the chat template (longctx's settings refuse think_tokens without it before this)
    with pytest.raises(RulerInputError) as e:
        prepare(reference_tokenizer_dir, [1024], tasks=["vt"], thinking=True, out_dir=tmp_path / "o",
                progress=False)
    e.value.owner = RulerRunSettings
    assert str(e.value) == ("--system-prompt, --chat-template-kwargs and --think-tokens are for the chat template; "
                            "add --template chat, or drop them")
    assert in_recipe(e.value).startswith("ruler.system_prompt, ruler.chat_template_kwargs and ruler.think_tokens ")
    assert not (tmp_path / "o").exists()


def test_a_ruler_tasks_refusal_from_the_command_line(ckpt, reference_tokenizer_dir, tmp_path):
    r = run("ruler", "prepare", "--tokenizer", reference_tokenizer_dir, "--lengths", "1k", "--tasks", "vt",
            "--template", "chat", "-o", tmp_path / "tasks")
    assert error_line(r) == f"--template {NO_CHAT}--template base"
    r = run("ruler", ckpt, "--lengths", "1k", "--tasks", "vt", "--template", "chat", "--backend", "hf", "-o",
            tmp_path / "run")
    assert error_line(r) == f"--template {NO_CHAT}--template base"
    assert not (tmp_path / "tasks").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow  # runs a recipe's ruler stage
def test_a_ruler_tasks_refusal_in_a_recipe(ckpt, tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", ckpt, {"template": "chat", "backend": "hf"})
    line = error_line(run("run", recipe, "-o", tmp_path / "out"))
    assert line == f"{recipe}: ruler for tiny: ruler.template {NO_CHAT}ruler.template base"
