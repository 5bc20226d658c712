"""The `longctx` command line: one command per verb, its options derived from the verb's settings type.

Bad input (a usage error, a bad setting, or a library `InputError`) prints one line and exits with code 2, as
does a refusal of the machine's inside a verb: a full disk, a read-only folder, a name too long, an input too
deep or too large (`longctx.core.failures`).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from longctx import __version__
from longctx.cli.options import settings_command
from longctx.convert.settings import ConvertSettings
from longctx.core.errors import InputError, ProcessFailed, printable
from longctx.eval.settings import MergeSettings, PrepareSettings, RulerRunSettings
from longctx.extend.settings import ExtendSettings
from longctx.info.describe import InfoSettings
from longctx.init.settings import InitSettings
from longctx.recipe.run import RunSettings
from longctx.report.settings import CompareSettings, ExportSettings
from longctx.sinks.settings import SinksSettings
from longctx.yarn.settings import YarnSettings
from ruler_tasks.errors import RulerInputError


class _Group(click.Group):
    """A click group whose errors are one line on stderr and exit code 2, never a traceback."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args, prog_name or "longctx", standalone_mode=False, **extra)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"Error: {printable(e.format_message())}{hint}", err=True)
            sys.exit(2)
        except (InputError, RulerInputError) as e:
            click.echo(f"Error: {printable(str(e))}", err=True)
            sys.exit(2)
        except ProcessFailed as e:
            click.echo(f"Error: {printable(str(e))}", err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"Error: {printable(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="longctx")
def cli():
    """Take a checkpoint to long context and measure what that did to it.

    Lengths accept k/K (both x1024, so 128k = 131072); numbers accept 1e6 or 1_000_000.
    """


def _echo_report(rep) -> None:
    """A report's tables between blank lines, then its notes."""
    click.echo("")
    click.echo(rep.markdown)
    click.echo("")
    for note in rep.notes:
        click.echo(f"note: {note}")


def _info(s: InfoSettings) -> None:
    """Show a checkpoint's architecture, attention variant, RoPE setup, lengths, size and fingerprint."""

    from longctx.info.describe import built_rope_text, describe, window_text

    d = dataclasses.asdict(describe(s.checkpoint, s.trust_remote_code))
    if s.json:
        click.echo(json.dumps(d, indent=2))
        return
    rope = f"{d['rope_type']}, base {d['rope_theta']}" + (" (model default)" if d["rope_theta_from_default"] else "")
    if d["rope_factor"] is not None:
        original = d["original_max_position_embeddings"]
        rope += f", factor {d['rope_factor']:g}" + (f" from original length {original}" if original else "")
    params = f"{d['parameters']:,}" if d["parameters"] is not None else "no weight files"
    if d["parameters"] is not None and d["gate_parameters"]:
        params += f" (without the gate: {d['parameters'] - d['gate_parameters']:,})"
    rows = [("checkpoint", d["checkpoint"]), ("architecture", f"{d['architecture']} (model_type {d['model_type']})"),
            ("attention", d["attention"]), *([("gate", d["gate"])] if d["gate"] else []), ("rope", rope),
            ("rope as built", built_rope_text(d["rope_layers"])),
            ("max_position_embeddings", d["max_position_embeddings"]),
            ("context length", f"{d['context_length']} tokens (prompt + generation)"),
            ("sliding window", window_text(d["sliding_window"])), ("parameters", params),
            ("fingerprint", d["fingerprint"])]
    if d["language_model"] is not None:
        rows.insert(2, ("language model", f"{d['language_model']}: its RoPE, lengths and windows below"))
    if d["remote_code"] is not None:
        rows.insert(2, ("remote code", ", ".join(f"{k}: {v}" for k, v in d["remote_code"].items())))
    if d["hub"] is not None:
        hub = d["hub"]
        rows.insert(1, ("hub", f"{hub['repo_id']}{'/' + hub['subfolder'] if hub['subfolder'] else ''} "
                               f"@ {hub['commit']}"))
    for key, value in rows:
        click.echo(f"{key:<24} {value}")


def _yarn(s: YarnSettings) -> None:
    """Write a YaRN-scaled copy of CHECKPOINT (static YaRN, as transformers and vLLM implement it)."""

    from longctx.yarn.scaling import yarn_checkpoint

    r = yarn_checkpoint(s)
    click.echo(f"wrote {r.output}")
    for line in r.changes:
        click.echo(f"  {line}")
    for note in r.notes:
        click.echo(f"  note: {note}")
    click.echo(f"context length: {r.context_length} tokens")
    click.echo("vLLM:")
    click.echo(f"  {r.vllm_serve}")
    click.echo(f"  {r.vllm_serve_overrides}")


def _init(s: InitSettings) -> None:
    """Write a freshly initialised checkpoint (config, safetensors, tokenizer) to OUTPUT."""

    from longctx.init.checkpoint import init_checkpoint

    r = init_checkpoint(s)
    click.echo(f"wrote {r.output}")
    click.echo(f"  {r.architecture} ({r.attention}), preset {r.preset}, {r.dtype}")
    click.echo(f"  parameters: {r.parameters:,} (baseline at this preset: {r.baseline_parameters:,}), "
               f"FFN {r.intermediate_size}, vocab {r.vocab_size}")


def _convert(s: ConvertSettings) -> None:
    """Convert checkpoint SOURCE from another layout into the longctx gated-attention family at OUTPUT."""

    from longctx.convert.layouts import convert_checkpoint

    r = convert_checkpoint(s)
    click.echo(f"wrote {r.output}")
    click.echo(f"  {r.architecture} ({r.attention}), {r.parameters:,} parameters, "
               f"{r.kv_groups} query heads per KV head")


def _extend(s: ExtendSettings) -> None:
    """Raise CHECKPOINT's RoPE base and continue training it on --seq-len sequences (accelerate; FSDP2 on many ranks).

    \b
    One process:  longctx extend CKPT --rope-base 1e6 --seq-len 32k --data DATA --tokens 1B -o OUT
    8 GPUs:       torchrun --nproc_per_node 8 -m longctx extend ...   (or: accelerate launch -m longctx extend ...)
    """

    from longctx.extend.loop import extend

    click.echo(f"log: {extend(s).log}")


def _run(s: RunSettings) -> None:
    """Run a recipe (recipes/*.yaml): every model through its stages, then the comparison table.

    Each stage is skipped when its outputs exist and its settings and inputs are unchanged, so rerunning
    the same command resumes an interrupted run.
    """

    from longctx.recipe.run import run_recipe

    run_recipe(s.recipe, s.output, s.from_stage, s.dry_run, log=click.echo)


def _sinks(s: SinksSettings) -> None:
    """Attention sinks, massive activations and gate sparsity of CHECKPOINT (the paper's Table 4 columns).

    Per layer and averaged: first-token attention (query position 0 excluded), M-Act (max |hidden
    state| of each layer's output), and for gated models the gate scores' mean, median and fractions
    below 0.1 and 0.5 (per head too). Chunked scores, never an L x L matrix: 32k runs on one GPU.
    """

    from longctx.report.sinks import write_sinks_report
    from longctx.sinks.measure import measure_sinks

    measure_sinks(s, log=click.echo)
    rep = write_sinks_report(s.output, plot=s.plot)
    _echo_report(rep)
    click.echo(f"wrote {', '.join(str(p) for p in rep.files)}")


def _compare(s: CompareSettings) -> None:
    """Compare RULER runs: a row per run, a column per length, degradation vs a reference length and parent."""

    from longctx.report.compare import compare

    c = compare(s)
    click.echo(c.markdown)
    if s.output:
        click.echo(f"wrote {', '.join(str(p) for p in c.files)}")


def _export(s: ExportSettings) -> None:
    """Write a RULER run's results as lm-eval's results JSON or as NVIDIA RULER's summary.csv files."""

    from longctx.report.external import export

    click.echo(f"wrote {', '.join(str(p) for p in export(s))}")


class _DefaultCommandGroup(click.Group):
    """A group whose first argument, when it is not a subcommand name, goes to `default_command`:
    `longctx ruler CKPT ...` means `longctx ruler run CKPT ...`, while `longctx ruler prepare ...` still works."""

    default_command = "run"

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


@cli.group(cls=_DefaultCommandGroup)
def ruler():
    """RULER: NVIDIA's synthetic long-context tasks (NVIDIA/RULER @ c3f5e3b).

    \b
    Evaluate a checkpoint (same as 'longctx ruler run CKPT ...'):
      longctx ruler CKPT --lengths 4k,8k,16k,32k,64k,128k --data-dir DATA -o RUN_DIR
    Only write the task files:
      longctx ruler prepare --tokenizer CKPT --lengths 4k,8k --data-dir DATA -o TASKS_DIR
    Split a run across jobs, then put it together:
      longctx ruler CKPT ... -o RUN_DIR --shard 1/4   (and 2/4, 3/4, 4/4)
      longctx ruler merge RUN_DIR
    """


def _prepare(s: PrepareSettings) -> None:
    """Write RULER task files, byte-identical to upstream's generators for the same inputs."""

    from longctx.eval.tasks import prepare_tasks

    r = prepare_tasks(s)
    click.echo(f"lengths: {', '.join(map(str, s.lengths))}")
    reused = sum(t.reused for t in r.timings)
    click.echo(f"{len(r.files)} task files ({reused} reused) and {r.out_dir / 'manifest.json'} in {r.out_dir}")


def _ruler_run(s: RulerRunSettings) -> None:
    """Evaluate CHECKPOINT on RULER: task files, greedy predictions, upstream scoring, tables and a plot.

    Resumable: rerun the same command to continue. Writes results.json, results.md, results.csv and
    results.png to the run directory and prints RULER's README table.
    """

    from longctx.eval.runner import run_ruler
    from longctx.report.run import write_report

    r = run_ruler(s, log=click.echo)
    t = r.timings
    if s.shard is not None:
        click.echo(f"{t['new_predictions']} new predictions ({t['reused_predictions']} reused) in "
                   f"{t['generate_s']:.1f} s: shard {s.shard} is done; when every shard is, score the run with "
                   f"`longctx ruler merge {s.output}`")
        return
    rep = write_report(s.output, plot=s.plot, intervals=s.intervals)
    _echo_report(rep)
    click.echo(f"{t['new_predictions']} new predictions ({t['reused_predictions']} reused) in {t['generate_s']:.1f} s; "
               f"total {t['total_s']:.1f} s")
    click.echo(f"results in {s.output}: {', '.join(p.name for p in rep.files)}")


def _merge(s: MergeSettings) -> None:
    """Put the shards of a RULER run together (`longctx ruler run ... --shard I/N -o RUN_DIR`): predictions and
    scores as the same run done in one go, then its tables and plot."""

    from longctx.eval.shards import merge_run
    from longctx.report.run import write_report

    rep = merge_run(s, lambda folder: write_report(folder, plot=s.plot, intervals=s.intervals), log=click.echo)
    _echo_report(rep)
    click.echo(f"results in {s.run_dir}: {', '.join(p.name for p in rep.files)}")


for group, name, settings, run in [
        (cli, "info", InfoSettings, _info), (cli, "yarn", YarnSettings, _yarn), (cli, "init", InitSettings, _init),
        (cli, "convert", ConvertSettings, _convert), (cli, "run", RunSettings, _run),
        (cli, "sinks", SinksSettings, _sinks), (cli, "extend", ExtendSettings, _extend),
        (cli, "compare", CompareSettings, _compare), (cli, "export", ExportSettings, _export),
        (ruler, "prepare", PrepareSettings, _prepare),
        (ruler, "run", RulerRunSettings, _ruler_run), (ruler, "merge", MergeSettings, _merge)]:
    settings_command(group, name, settings, run)


def main():
    cli()
