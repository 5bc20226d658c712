"""The `longctx` command line: one small function per verb, each calling one library function.

Bad input (a usage error or a library `InputError`) prints one line and exits with code 2.
"""

from __future__ import annotations

import json
import sys

import click

from longctx import __version__
from longctx.errors import InputError
from longctx.params import FACTOR, LENGTHS
from ruler_tasks.errors import RulerInputError


class _Group(click.Group):
    """A click group whose errors are one line on stderr and exit code 2, never a traceback."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args, prog_name or "longctx", standalone_mode=False, **extra)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"Error: {e.format_message()}{hint}", err=True)
            sys.exit(2)
        except (InputError, RulerInputError) as e:
            click.echo(f"Error: {e}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
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


@cli.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def info(checkpoint, as_json):
    """Show a checkpoint's architecture, attention variant, RoPE setup, lengths, size and fingerprint."""
    from longctx.checkpoint import describe

    d = describe(checkpoint)
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    rope = f"{d['rope_type']}, base {d['rope_theta']}" + (" (model default)" if d["rope_theta_from_default"] else "")
    if d["yarn_factor"] is not None:
        rope += f", factor {d['yarn_factor']:g} from original length {d['original_max_position_embeddings']}"
    params = f"{d['parameters']:,}" if d["parameters"] is not None else "no weight files"
    rows = [
        ("checkpoint", d["checkpoint"]),
        ("architecture", f"{d['architecture']} (model_type {d['model_type']})"),
        ("attention", d["attention"]),
        ("rope", rope),
        ("max_position_embeddings", d["max_position_embeddings"]),
        ("context length", f"{d['context_length']} tokens (prompt + generation)"),
        ("parameters", params),
        ("fingerprint", d["fingerprint"]),
    ]
    for key, value in rows:
        click.echo(f"{key:<24} {value}")


@cli.command()
@click.argument("checkpoint")
@click.option("--factor", type=FACTOR, required=True, help="Context scaling factor, > 1 (4: 32k -> 128k).")
@click.option("--original-max-position-embeddings", "original", type=click.IntRange(min=1),
              help="Length the model was trained at [default: the checkpoint's trained length].")
@click.option("-o", "--output", type=click.Path(), help="Output directory [default: CHECKPOINT-yarn<factor>x].")
@click.option("--rescale", is_flag=True, help="Re-scale a checkpoint that is already YaRN-scaled.")
@click.option("--overwrite", is_flag=True, help="Replace the output directory if it exists.")
@click.option("--beta-fast", type=float, help="YaRN beta_fast (written only when given; engines default to 32).")
@click.option("--beta-slow", type=float, help="YaRN beta_slow (written only when given; engines default to 1).")
@click.option("--truncate/--no-truncate", default=None, help="Round the ramp bounds (written only when given).")
@click.option("--config-format", type=click.Choice(["v5", "v4", "both"]), default="v5", show_default=True,
              help="v5: rope_parameters (transformers 5); v4: rope_theta + rope_scaling; both.")
def yarn(checkpoint, factor, original, output, rescale, overwrite, beta_fast, beta_slow, truncate, config_format):
    """Write a YaRN-scaled copy of CHECKPOINT (static YaRN, as transformers and vLLM implement it)."""
    from longctx.rope import yarn_checkpoint

    r = yarn_checkpoint(checkpoint, factor, output, original, rescale, overwrite, beta_fast, beta_slow, truncate,
                        config_format)
    click.echo(f"wrote {r['output']}")
    for line in r["changes"]:
        click.echo(f"  {line}")
    for note in r["notes"]:
        click.echo(f"  note: {note}")
    click.echo(f"context length: {r['context_length']} tokens")
    click.echo("vLLM:")
    click.echo(f"  {r['vllm_serve']}")
    click.echo(f"  {r['vllm_serve_overrides']}")


@cli.group()
def ruler():
    """RULER: the 13 synthetic long-context tasks (NVIDIA/RULER @ c3f5e3b)."""


@ruler.command("prepare")
@click.option("--tokenizer", required=True, help="Tokenizer directory (or checkpoint) that counts the lengths.")
@click.option("--lengths", type=LENGTHS, required=True, help="Context lengths, e.g. 4k,8k,131072 (k/K = x1024).")
@click.option("--tasks", help="Comma-separated task names [default: all 13].")
@click.option("--samples", type=click.IntRange(min=1), default=500, show_default=True, help="Samples per task and length.")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--template", type=click.Choice(["base", "chat"]), default="base", show_default=True,
              help="base: RULER's plain prompt; chat: the tokenizer's chat template, answer prefix in the assistant turn.")
@click.option("--data-dir", type=click.Path(), help="Folder with essay.json, squad.json and hotpotqa.json.")
@click.option("--essay", help="Essay haystack (RULER's PaulGrahamEssays.json format): a file or hf:<dataset id>.")
@click.option("--squad", help="SQuAD v2.0 dev (for qa_1): a file or hf:<dataset id>.")
@click.option("--hotpotqa", help="HotpotQA dev-distractor (for qa_2): a file or hf:<dataset id>.")
@click.option("-o", "--output", required=True, type=click.Path(), help="Output folder: <length>/<task>.jsonl + manifest.")
def ruler_prepare(tokenizer, lengths, tasks, samples, seed, template, data_dir, essay, squad, hotpotqa, output):
    """Write RULER task files, byte-identical to upstream's generators for the same inputs."""
    from ruler_tasks.prepare import prepare

    click.echo(f"lengths: {', '.join(map(str, lengths))}")
    r = prepare(tokenizer, lengths, tasks, samples, seed, template, data_dir, essay, squad, hotpotqa, output)
    reused = sum(t.reused for t in r.timings)
    click.echo(f"{len(r.files)} task files ({reused} reused) and {r.out_dir / 'manifest.json'} in {r.out_dir}")


@cli.command()
@click.argument("out", type=click.Path())
@click.option("--preset", required=True, help="Model shape: tiny (seconds on CPU) or paper-1.7b.")
@click.option("--attention", required=True,
              help="baseline (plain Qwen3), elementwise or headwise (the paper's G1 output gate).")
@click.option("--tokenizer", default="reference", show_default=True,
              help="reference (Mistral v1 32k SentencePiece from mistral_common), bpe (train a small BPE now), "
                   "or a local tokenizer directory.")
@click.option("--vocab-size", "bpe_vocab_size", type=click.IntRange(min=260), default=4096, show_default=True,
              help="Vocabulary of the BPE trained by --tokenizer bpe.")
@click.option("--bpe-corpus", type=click.Path(), help="Text file to train --tokenizer bpe on [default: built-in "
                                                      "word-list corpus].")
@click.option("--match-params", is_flag=True, help="Shrink a gated model's FFN so its size equals the baseline's.")
@click.option("--dtype", help="Weights dtype: float32, bfloat16 or float16 [default: float32 for tiny, "
                              "bfloat16 for paper-1.7b].")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the initialisation.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def init(out, preset, attention, tokenizer, bpe_vocab_size, bpe_corpus, match_params, dtype, seed, overwrite):
    """Write a freshly initialised checkpoint (config, safetensors, tokenizer) to OUT."""
    from longctx.models.presets import init_checkpoint

    r = init_checkpoint(out, preset, attention, tokenizer, match_params, seed, overwrite, dtype, bpe_vocab_size,
                        bpe_corpus)
    click.echo(f"wrote {r['output']}")
    click.echo(f"  {r['architecture']} ({r['attention']}), preset {r['preset']}, {r['dtype']}")
    click.echo(f"  parameters: {r['parameters']:,} (baseline at this preset: {r['baseline_parameters']:,}), "
               f"FFN {r['intermediate_size']}, vocab {r['vocab_size']}")


@cli.command()
@click.argument("src")
@click.argument("out", type=click.Path())
@click.option("--from", "source", required=True, help="Layout of SRC: official (the paper's released checkpoints).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def convert(src, out, source, overwrite):
    """Convert checkpoint SRC from another layout into the longctx gated-attention family at OUT."""
    from longctx.models.convert import convert_checkpoint

    r = convert_checkpoint(src, out, source, overwrite)
    click.echo(f"wrote {r['output']}")
    click.echo(f"  {r['architecture']} ({r['attention']}), {r['parameters']:,} parameters, "
               f"{r['kv_groups']} query heads per KV head")


def main():
    cli()


if __name__ == "__main__":
    main()
