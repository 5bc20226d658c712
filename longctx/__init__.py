"""longctx: take a language-model checkpoint to long context and measure what that did to it.

    longctx run recipes/tiny-seeds.yaml          # the demo: two tiny models x three seeds (CPU, ~20 min)
    longctx extend CKPT --rope-base 1e6 --seq-len 32k --data DATA --tokens 1B -o OUT
    longctx yarn OUT --factor 4
    longctx ruler OUT-yarn4x --lengths 4k,8k,16k,32k,64k,128k --data-dir DATA -o RUN

Layers, lowest first; a module imports only lower layers or its own folder, stages never import each
other, and nothing imports the CLI (tests/test_layers.py checks it):

    core        errors, units, atomic files, hashing, timestamps, setting kinds, the settings base
    models      the gated-attention family for transformers and vLLM     (ruler_tasks sits here too:
                                                                          the RULER generators, a leaf)
    checkpoint  checkpoint folders: configs (a composite one's language model), fingerprints, side files,
                provenance, loaders
    rope        RoPE: one record per type, reading and writing it in config.json, what transformers builds
    data, info  text documents from data specs, the synthetic corpora; what a checkpoint is (`info`)
    stages      checkpoint -> checkpoint: init, convert, yarn, extend; prompts -> predictions -> scores:
                eval; checkpoint -> measurements: sinks. Each has a settings type (`<stage>/settings.py`).
    report      result files -> tables and plots (compare, sinks tables, loss curves); runs no model
    recipe      recipes: sections (the stages' settings), loading, the plan, the runner
    cli         the command line, derived from the settings types

Importing longctx registers the gated-attention family (`gated_qwen3`) with transformers' Auto
classes, so `AutoModelForCausalLM.from_pretrained(dir)` loads any checkpoint longctx writes. The
import itself stays light: if transformers is already imported the classes are registered now,
otherwise right after transformers is first imported (a one-shot import hook), so `longctx --help`
and the stages that never touch transformers do not pay for torch and transformers.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import warnings

__version__ = "0.1.0"


def _register_transformers_classes() -> None:
    if "longctx.models.gated_qwen3" in sys.modules:
        return  # imported (or being imported): the module registers the classes itself when it finishes
    try:
        from longctx.models.gated_qwen3 import register_auto_classes

        register_auto_classes()
    except Exception as e:  # noqa: BLE001 - never break `import transformers` for the user; say why instead
        warnings.warn(f"longctx could not register the gated_qwen3 model with transformers: {e!r}", stacklevel=2)


def _register_when_transformers_is_imported() -> None:
    if "transformers" in sys.modules:
        _register_transformers_classes()
        return

    class _AfterTransformersImport(importlib.abc.MetaPathFinder):
        """Find `transformers` with the normal finders, then register once its __init__ has run."""

        def find_spec(self, name, path=None, target=None):
            if name != "transformers":
                return None
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # one shot (also keeps the lookup below from recursing)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_register(module):
                exec_module(module)
                _register_transformers_classes()

            spec.loader.exec_module = exec_then_register
            return spec

    sys.meta_path.insert(0, _AfterTransformersImport())


def _adopt_when_started_for_longctx() -> None:
    """A process a longctx process started for its work (vLLM's engine, a launcher and its ranks) binds itself to
    its parent before anything else: multiprocessing's spawn imports the parent's main module, longctx's, first
    thing, and a launched rank runs `-m longctx`, so a parent killed while the child is still starting (seconds
    for vLLM's engine) leaves nothing behind (`longctx.core.processes.adopt`)."""
    if os.environ.get("LONGCTX_PARENT"):
        from longctx.core.processes import adopt

        adopt()


_register_when_transformers_is_imported()
_adopt_when_started_for_longctx()
