"""The `longctx` command line: one small function per verb, each calling one library function.

Bad input (a usage error or a library `InputError`) prints one line and exits with code 2.
"""

from __future__ import annotations

import json
import sys

import click

from longctx import __version__
from longctx.errors import InputError
from longctx.params import COUNT, FACTOR, LENGTHS, NUMBER
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
    """RULER: the 13 synthetic long-context tasks (NVIDIA/RULER @ c3f5e3b).

    \b
    Evaluate a checkpoint (same as 'longctx ruler run CKPT ...'):
      longctx ruler CKPT --lengths 4k,8k,16k,32k,64k,128k --data-dir DATA -o RUN_DIR
    Only write the task files:
      longctx ruler prepare --tokenizer CKPT --lengths 4k,8k --data-dir DATA -o TASKS_DIR
    """


def _task_options(command):
    """The options that say which RULER task files to make (shared by `ruler prepare` and `ruler run`)."""
    options = [
        click.option("--lengths", type=LENGTHS, required=True,
                     help="Context lengths, e.g. 4k,8k,16k,32k,64k,128k (k/K = x1024)."),
        click.option("--tasks", help="Comma-separated task names [default: all 13]."),
        click.option("--samples", type=click.IntRange(min=1), default=500, show_default=True,
                     help="Samples per task and length."),
        click.option("--seed", type=int, default=42, show_default=True, help="Task generation seed."),
        click.option("--template", type=click.Choice(["base", "chat"]), default="base", show_default=True,
                     help="base: RULER's plain prompt; chat: the tokenizer's chat template, answer prefix in the "
                          "assistant turn."),
        click.option("--data-dir", type=click.Path(), help="Folder with essay.json, squad.json and hotpotqa.json."),
        click.option("--essay", help="Essay haystack (RULER's PaulGrahamEssays.json format): a file or "
                                     "hf:<dataset id>."),
        click.option("--squad", help="SQuAD v2.0 dev (for qa_1): a file or hf:<dataset id>."),
        click.option("--hotpotqa", help="HotpotQA dev-distractor (for qa_2): a file or hf:<dataset id>."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@ruler.command("prepare")
@click.option("--tokenizer", required=True, help="Tokenizer directory (or checkpoint) that counts the lengths.")
@_task_options
@click.option("-o", "--output", required=True, type=click.Path(), help="Output folder: <length>/<task>.jsonl + manifest.")
def ruler_prepare(tokenizer, lengths, tasks, samples, seed, template, data_dir, essay, squad, hotpotqa, output):
    """Write RULER task files, byte-identical to upstream's generators for the same inputs."""
    from ruler_tasks.prepare import prepare

    click.echo(f"lengths: {', '.join(map(str, lengths))}")
    r = prepare(tokenizer, lengths, tasks, samples, seed, template, data_dir, essay, squad, hotpotqa, output)
    reused = sum(t.reused for t in r.timings)
    click.echo(f"{len(r.files)} task files ({reused} reused) and {r.out_dir / 'manifest.json'} in {r.out_dir}")


@ruler.command("run")
@click.argument("checkpoint")
@_task_options
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Run directory: tasks, predictions, results (a rerun resumes it).")
@click.option("--backend", default="vllm", show_default=True,
              help="vllm (offline engine here), openai (an OpenAI-compatible server) or hf (transformers).")
@click.option("--dtype", default="auto", show_default=True, help="vllm/hf: weights dtype (auto, bfloat16, float32, ...).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, help="vllm.")
@click.option("--data-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, help="vllm.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), help="vllm: share of GPU memory.")
@click.option("--kv-cache-memory", type=NUMBER, help="vllm: KV-cache size in bytes (e.g. 8e9), instead of the share.")
@click.option("--enforce-eager", is_flag=True, help="vllm: no CUDA graphs.")
@click.option("--base-url", help="openai: endpoint, e.g. http://127.0.0.1:8000/v1 (key from OPENAI_API_KEY).")
@click.option("--served-model", help="openai: model name on the server [default: the first it serves].")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="openai: requests in flight.")
@click.option("--plot/--no-plot", default=True, show_default=True, help="Write results.png (needs longctx[plot]).")
def ruler_run(checkpoint, lengths, tasks, samples, seed, template, data_dir, essay, squad, hotpotqa, output, backend,
              dtype, tensor_parallel_size, data_parallel_size, gpu_memory_utilization, kv_cache_memory, enforce_eager,
              base_url, served_model, concurrency, plot):
    """Evaluate CHECKPOINT on RULER: task files, greedy predictions, upstream scoring, tables and a plot.

    Resumable: rerun the same command to continue. Writes results.json, results.md, results.csv and
    results.png to the run directory and prints RULER's README table.
    """
    from longctx.eval.backends import check_backend
    from longctx.eval.runner import run_ruler
    from longctx.report import write_report

    check_backend(backend)
    opts = {"dtype": dtype, "tensor_parallel_size": tensor_parallel_size, "data_parallel_size": data_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": enforce_eager,
            "kv_cache_memory": int(kv_cache_memory) if kv_cache_memory else None,
            "base_url": base_url, "model": served_model, "concurrency": concurrency}
    if backend == "openai" and not base_url:
        raise InputError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    click.echo(f"lengths: {', '.join(map(str, lengths))}")
    r = run_ruler(checkpoint, lengths, output, tasks=tasks, samples=samples, seed=seed, template=template,
                  data_dir=data_dir, essay=essay, squad=squad, hotpotqa=hotpotqa, backend=backend,
                  backend_options={k: v for k, v in opts.items() if v is not None}, log=click.echo)
    rep = write_report(output, plot=plot)
    click.echo("")
    click.echo(rep.markdown)
    click.echo("")
    for note in rep.notes:
        click.echo(f"note: {note}")
    t = r.timings
    click.echo(f"{t['new_predictions']} new predictions ({t['reused_predictions']} reused) in {t['generate_s']:.1f} s; "
               f"total {t['total_s']:.1f} s")
    click.echo(f"results in {output}: {', '.join(p.name for p in rep.files)}")


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--baseline", type=click.Path(), help="A run every other run is compared against (its Avg.).")
@click.option("--reference", type=LENGTHS, help="Reference length of the degradation columns [default: the longest "
                                                "length every run had before extension].")
@click.option("-o", "--output", type=click.Path(), help="Also write compare.md, compare.csv and compare.png here.")
def compare(runs, baseline, reference, output):
    """Compare RULER runs: a row per run, a column per length, degradation vs a reference length and parent."""
    from longctx.report import compare as compare_runs

    if reference is not None and len(reference) != 1:
        raise InputError("--reference takes one length (e.g. 32k)")
    c = compare_runs(list(runs), baseline, reference[0] if reference else None, output)
    click.echo(c.markdown)
    if output:
        click.echo(f"wrote {', '.join(str(p) for p in c.files)}")


@cli.command()
@click.argument("out", type=click.Path())
@click.option("--preset", required=True, help="Model shape: tiny (seconds on CPU) or paper-1.7b.")
@click.option("--attention", required=True,
              help="baseline (plain Qwen3), elementwise or headwise (the paper's G1 output gate).")
@click.option("--tokenizer", default="reference", show_default=True,
              help="reference (Mistral v1 32k SentencePiece from mistral_common), bpe (train a small byte-level "
                   "BPE now, one token per digit), or a local tokenizer directory.")
@click.option("--vocab-size", "bpe_vocab_size", type=click.IntRange(min=260), default=4096, show_default=True,
              help="Vocabulary of the BPE trained by --tokenizer bpe.")
@click.option("--bpe-corpus", type=click.Path(), help="Text file to train --tokenizer bpe on [default: built-in "
                                                      "word-list corpus].")
@click.option("--match-params", is_flag=True, help="Shrink a gated model's FFN so its size equals the baseline's.")
@click.option("--dtype", help="Weights dtype: float32, bfloat16 or float16 [default: float32 for tiny, "
                              "bfloat16 for paper-1.7b].")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the initialisation.")
@click.option("--untie-embeddings", is_flag=True, help="Give the output layer its own matrix instead of the input "
                                                       "embedding's (the presets tie them).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
def init(out, preset, attention, tokenizer, bpe_vocab_size, bpe_corpus, match_params, dtype, seed, untie_embeddings,
         overwrite):
    """Write a freshly initialised checkpoint (config, safetensors, tokenizer) to OUT."""
    from longctx.models.presets import init_checkpoint

    untie = {"tie_word_embeddings": False} if untie_embeddings else {}
    r = init_checkpoint(out, preset, attention, tokenizer, match_params, seed, overwrite, dtype, bpe_vocab_size,
                        bpe_corpus, **untie)
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


@cli.command("run")
@click.argument("recipe", type=click.Path())
@click.option("-o", "--output", type=click.Path(), help="Output folder [default: runs/<recipe name>].")
@click.option("--from", "from_stage", help="Rerun from this stage on (init, convert, pretrain, extend, yarn, ruler, "
                                           "sinks, compare); the stages before it must have run.")
@click.option("--dry-run", is_flag=True, help="Print the plan (settings, outputs, run/skip, launch lines); run nothing.")
def run(recipe, output, from_stage, dry_run):
    """Run a recipe (recipes/*.yaml): every model through its stages, then the comparison table.

    Each stage is skipped when its outputs exist and its settings and inputs are unchanged, so rerunning
    the same command resumes an interrupted run.
    """
    from longctx.pipeline import run_recipe

    run_recipe(recipe, output, from_stage, dry_run, log=click.echo)


@cli.command()
@click.argument("checkpoint")
@click.option("--data", help="Text: a .txt/.jsonl/.json/.parquet file, a directory of them, a saved dataset, "
                             "hf:<dataset id>[:split] or synthetic:<kind> [default: the first built-in synthetic "
                             "corpus].")
@click.option("--tokens", type=LENGTHS, default="16k", show_default=True,
              help="Tokens to analyse, as ceil(tokens / length) windows (k = x1024).")
@click.option("--length", type=LENGTHS, help="Window length [default: the checkpoint's trained length, at most 4k].")
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Folder for sinks.json, sinks.md and sinks.png (a RULER run directory: compare then shows them).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True, help="Windows per forward.")
@click.option("--chunk", type=click.IntRange(min=1),
              help="Queries per score chunk [default: the fp32 scores of one chunk stay under 256 MiB].")
@click.option("--dtype", help="auto, float32, bfloat16 or float16 [default: auto on GPU, float32 on CPU].")
@click.option("--device", help="cpu, cuda, cuda:1, ... [default: cuda when available].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of synthetic data.")
@click.option("--plot/--no-plot", default=True, show_default=True, help="Write sinks.png (needs longctx[plot]).")
def sinks(checkpoint, data, tokens, length, output, batch_size, chunk, dtype, device, seed, plot):
    """Attention sinks, massive activations and gate sparsity of CHECKPOINT (the paper's Table 4 columns).

    Per layer and averaged: first-token attention (query position 0 excluded), M-Act (max |hidden
    state| of each layer's output), and for gated models the gate scores' mean, median and fractions
    below 0.1 and 0.5 (per head too). Chunked scores, never an L x L matrix: 32k runs on one GPU.
    """
    from longctx.sinks import analyze_sinks

    for name, value in (("--tokens", tokens), ("--length", length)):
        if value is not None and len(value) != 1:
            raise InputError(f"{name} takes one number (e.g. 16k)")
    r = analyze_sinks(checkpoint, output, data=data, tokens=tokens[0], length=length[0] if length else None,
                      batch_size=batch_size, chunk=chunk, dtype=dtype, device=device, seed=seed, plot=plot,
                      log=click.echo)
    click.echo("")
    click.echo(r["markdown"])
    click.echo("")
    for note in r["notes"]:
        click.echo(f"note: {note}")
    click.echo(f"wrote {', '.join(str(p) for p in r['files'])}")


@cli.command()
@click.argument("checkpoint")
@click.option("--rope-base", type=NUMBER, help="New RoPE base (ABF), e.g. 1e6 [default: keep the checkpoint's].")
@click.option("--seq-len", type=LENGTHS, required=True,
              help="Training sequence length, e.g. 32k; becomes max_position_embeddings.")
@click.option("--data", multiple=True, required=True,
              help="Training text (repeatable): a .txt/.jsonl/.json/.parquet file, a directory of them, a saved "
                   "dataset, hf:<dataset id>[:split] or synthetic:<kind>.")
@click.option("--short-data", multiple=True, help="Short documents mixed in for --short-fraction of the tokens "
                                                   "(repeatable; same forms as --data).")
@click.option("--short-fraction", type=float, default=0.0, show_default=True,
              help="Share of the tokens from --short-data (ProLong: 0.3-0.4).")
@click.option("--tokens", type=COUNT, help="Tokens to train on, e.g. 80B or 1e9 (k/M = x1024, B = 10^9).")
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps (instead of --tokens).")
@click.option("-o", "--output", required=True, type=click.Path(), help="Output checkpoint directory.")
@click.option("--lr", type=float, default=2e-5, show_default=True, help="Peak learning rate (AdamW).")
@click.option("--warmup-fraction", type=float, default=0.1, show_default=True, help="Share of steps in warmup.")
@click.option("--min-lr-ratio", type=float, default=0.1, show_default=True, help="Cosine decays to lr x this.")
@click.option("--tokens-per-step", type=COUNT,
              help="Tokens per optimizer step, rounded to whole sequences [default: 4M, at most --tokens / 20].")
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sequences per forward pass on each rank.")
@click.option("--save-every", type=click.IntRange(min=1), help="Save resumable state every N steps [default: at the end].")
@click.option("--resume", is_flag=True, help="Continue from the latest state in OUTPUT.train/ (same settings).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT and start over in OUTPUT.train/.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the data order and synthetic data.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]),
              help="Compute dtype [default: bfloat16 on GPU, float32 on CPU].")
@click.option("--no-gradient-checkpointing", is_flag=True, help="Keep activations (faster, far more memory).")
@click.option("--cp-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Context-parallel ranks per sequence (GPUs; causal attention, no document masking).")
@click.option("--cache-dir", type=click.Path(), help="Tokenized-data cache [default: ~/.cache/longctx/data].")
def extend(checkpoint, rope_base, seq_len, data, short_data, short_fraction, tokens, steps, output, lr,
           warmup_fraction, min_lr_ratio, tokens_per_step, micro_batch_size, save_every, resume, overwrite, seed,
           dtype, no_gradient_checkpointing, cp_size, cache_dir):
    """Raise CHECKPOINT's RoPE base and continue training it on --seq-len sequences (accelerate; FSDP2 on many ranks).

    \b
    One process:  longctx extend CKPT --rope-base 1e6 --seq-len 32k --data DATA --tokens 1B -o OUT
    8 GPUs:       torchrun --nproc_per_node 8 -m longctx extend ...   (or: accelerate launch -m longctx extend ...)
    """
    from longctx.train.loop import TrainSettings, train

    if len(seq_len) != 1:
        raise InputError("--seq-len takes one length (e.g. 32k)")
    settings = TrainSettings(
        checkpoint=checkpoint, output=output, seq_len=seq_len[0], data=list(data), rope_base=rope_base,
        short_data=list(short_data), short_fraction=short_fraction, tokens=tokens, steps=steps,
        tokens_per_step=tokens_per_step, micro_batch_size=micro_batch_size, lr=lr, warmup_fraction=warmup_fraction,
        min_lr_ratio=min_lr_ratio, save_every=save_every, seed=seed, dtype=dtype,
        gradient_checkpointing=not no_gradient_checkpointing, cp_size=cp_size, resume=resume, overwrite=overwrite,
        cache_dir=cache_dir)
    r = train(settings)
    click.echo(f"log: {r['log']}")


def main():
    cli()


if __name__ == "__main__":
    main()
