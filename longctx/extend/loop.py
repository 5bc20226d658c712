"""`longctx extend`: continue training a checkpoint at a longer length with a new RoPE base, resumably.

    longctx extend CKPT --rope-base 1e6 --seq-len 32k --data DATA --tokens 1B -o OUT
    torchrun --nproc_per_node 8 -m longctx extend ...     (or: accelerate launch -m longctx extend ...)

The loss is summed per token and divided by the number of predicted tokens of the whole step (all
micro-batches, all ranks), never averaged per micro-batch. State lives in a work folder beside the
output (`OUT.train/`): `settings.json` (what the run is), `step-NNNNNN/` (`longctx.extend.state`) and
`train_log.jsonl`, read back by `--resume` (`longctx.extend.resume`). The output folder is written once, at the
end (`longctx.extend.output`).

One run writes an output at a time: the main process holds `longctx.core.locks.OutputLock` on OUT (which covers
OUT.train) from the output check until the output is in place. Everything the run would refuse is refused before
the first step (the output's config, dtype and location, the whole work folder of a resume), and every rank
refuses with the same line (`_agree`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import checkpoint_dir, fingerprint, read_config
from longctx.checkpoint.load import model_config, sliding_window
from longctx.checkpoint.text_config import text_config_key
from longctx.checkpoint.tokenizer import load_tokenizer, require_tokenizer_files
from longctx.core.errors import InputError, ref
from longctx.core.files import (
    CHECKPOINT_KIND,
    cache_dir,
    check_output,
    make_output,
    open_in_place,
    output_kind,
    remove_output,
    temp_prefix,
    write_atomic,
    write_json,
)
from longctx.core.locks import OutputLock
from longctx.core.parse import loads
from longctx.core.processes import available_cores, is_main_process
from longctx.extend.model import (
    attention_implementation,
    fsdp_plugin,
    load_training_model,
    make_accelerator,
    make_training_module,
)
from longctx.extend.output import LOG_FILE, output_config, write_output
from longctx.extend.plan import Plan, check_parallelism, resolve_plan
from longctx.extend.resume import SETTINGS_FILE, WORK_KIND, Resume, check_work, record, work_dir
from longctx.extend.settings import ExtendSettings
from longctx.extend.state import load_training_state, save_training_state
from longctx.extend.steps import (
    Trainer,
    append_log_line,
    log_entry,
    make_trainer,
    micro_batches,
    peak_per_device,
    train_step,
)
from longctx.extend.throughput import model_flops
from longctx.info.describe import checkpoint_name, sliding_note
from longctx.rope.built import reach_notes
from longctx.rope.config import check_written_rope, read_rope, set_rope_base
from longctx.rope.layers import read_rope_layers, set_rope_base_layers


@dataclass(frozen=True)
class ExtendResult:
    output: Path
    steps: int
    tokens: int
    final_loss: float
    log: Path  # train_log.jsonl in the output
    seconds: float


@dataclass(frozen=True)
class _Checked:
    """What the checks before any work found."""

    ckpt: Path
    new_cfg: dict[str, Any]  # the checkpoint's config with the new RoPE
    notes: list[str]
    plan: Plan
    attn: str
    attn_reason: str
    source_fp: str
    resume: Resume


def _agree(error: InputError | None) -> None:
    """Raise on every rank the refusal of the first rank that has one (if any). A refusal on one rank alone (the
    main process's lock, a write only it does) would leave the others waiting in their next collective call."""
    import torch.distributed as dist

    first = None if error is None else str(error)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        errors: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, first)
        first = next((e for e in errors if e is not None), None)
    if first is None:
        return
    if error is not None and str(error) == first:
        raise error
    raise InputError(first)


def _check_location(out: Path, work: Path) -> None:
    """InputError for an output whose folders could not be made where it is: a work folder that is a symbolic link
    (a resume would read, an --overwrite delete, another folder), a name too long for the temporary folder the
    output is written in."""
    if work.is_symlink():
        raise InputError(f"work folder '{work}' is a symbolic link (to {os.readlink(work)}); longctx keeps a run's "
                         "state in a folder of its own beside the output: remove the link or choose another -o")
    where = next((p for p in [out.parent, *out.parent.parents] if p.is_dir()), Path("/"))
    try:
        limit = os.pathconf(where, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max(len(work.name), len(temp_prefix(out.name, "tmp")) + 8)  # tempfile.mkdtemp adds 8 characters
    if longest > limit:
        raise InputError(f"output name '{out.name}' is too long: the folder it is written in would have a name of "
                         f"{longest} characters, over the {limit} the file system allows; choose a shorter -o")


def _take_output(s: ExtendSettings, ckpt: Path, held: contextlib.ExitStack) -> None:
    """Lock the output (main process), then check it and the work folder beside it."""
    out = Path(s.output)
    work = work_dir(out)
    if is_main_process():
        try:
            held.enter_context(OutputLock(out, "output"))
        except OSError as e:
            raise InputError(f"cannot write beside the output '{out}' ({e.strerror or e}); choose another -o") \
                from None
    check_output(out, CHECKPOINT_KIND, inputs=[("input checkpoint", ckpt)], overwrite=s.overwrite)
    _check_location(out, work)
    # replaced on --overwrite (or on --resume before anything was saved); an existing one needs either flag:
    check_output(work, WORK_KIND, inputs=[("input checkpoint", ckpt)], overwrite=True)
    if output_kind(work) is not None and not (s.resume or s.overwrite):
        raise s.error(f"work folder '{work}' exists from an earlier run; pass {ref('resume')} to continue it "
                      f"or {ref('overwrite')} to start over")


def _validate(s: ExtendSettings, world_size: int, cuda: bool, held: contextlib.ExitStack
              ) -> tuple[Path, dict[str, Any], list[str]]:
    """Check what the settings alone cannot (the checkpoint, the launch, the output and the config it will get)
    before anything is written, the output locked from its check on (`held` releases it); returns (checkpoint
    dir, new config, notes)."""
    if s.checkpoint is None or s.output is None:
        raise InputError("extend needs a checkpoint and an output directory")
    s.check_inputs()
    check_parallelism(s.cp_size, world_size, s.seq_len, cuda)
    ckpt = checkpoint_dir(s.checkpoint, weights=True)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    config = model_config(ckpt, trust_remote_code=s.trust_remote_code)
    notes = []
    if s.rope_base is not None and s.rope_base == rope.theta:
        notes.append(f"the RoPE base is already {rope.theta}; training at the longer length with it unchanged")
    base = s.rope_base if s.rope_base is not None else rope.theta
    layers = read_rope_layers(cfg, config)
    if layers is None:
        new_cfg, new_rope = set_rope_base(cfg, base, s.seq_len)
    else:  # the new base for the layers that see the whole sequence; sliding layers keep theirs
        new_cfg, new_layers, kept = set_rope_base_layers(cfg, layers, base, s.seq_len)
        new_rope, notes = new_layers.types, notes + kept
    # before any training: the config the output will have (its dtype too) gives this RoPE in the model
    # transformers builds from it (its rotary module, every layer type), as the training model is built from it
    built = check_written_rope(output_config(new_cfg, str(ckpt / "config.json")), new_rope,
                               trust_remote_code=s.trust_remote_code, checkpoint=ckpt)
    notes += reach_notes(built, "the new base", layers.long_types if layers is not None else None)
    require_tokenizer_files(ckpt)
    key = text_config_key(cfg)
    if key is not None:
        notes.append(f"{checkpoint_name(ckpt)} is a {(cfg.get('architectures') or [cfg.get('model_type')])[0]}: "
                     f"extend trains its language model ({key}) on text; the other parts (a vision tower) get no "
                     "gradient and are saved as they were")
    window = sliding_note(checkpoint_name(ckpt), sliding_window(config), [s.seq_len])
    if window:
        notes.append(f"{window}; the output keeps the window")
    _take_output(s, ckpt, held)
    return ckpt, new_cfg, notes


def _check_before_work(s: ExtendSettings, world_size: int, cuda: bool, held: contextlib.ExitStack) -> _Checked:
    """Every check that needs no model: the settings, checkpoint and output (`_validate`), the plan, the
    attention, and the work folder a resume continues (`longctx.extend.resume.check_work`)."""
    ckpt, new_cfg, notes = _validate(s, world_size, cuda, held)
    plan = resolve_plan(s, world_size)
    attn, attn_reason = attention_implementation(s.attention, cuda, s.cp_size)  # refused before the weights are hashed
    source_fp = fingerprint(ckpt)
    return _Checked(ckpt, new_cfg, notes, plan, attn, attn_reason, source_fp, check_work(s, plan, source_fp))


def _start_work(acc, s: ExtendSettings, work: Path, c: _Checked, ds) -> None:
    """Check the data against the run being resumed, or (nothing saved) start the work folder afresh."""
    if c.resume.saved is not None and c.resume.saved["data_fingerprint"] != ds.fingerprint:
        raise s.error(f"{ref('resume')}: the data behind {', '.join(s.data + s.short_data)} changed since the run "
                      f"in '{work}' started; restore it or pass {ref('overwrite')} to start over")
    acc.wait_for_everyone()  # every rank has read the work folder before the main process changes it
    error = None
    if acc.is_main_process and c.resume.step_dir is None:
        # _validate allowed an existing (longctx-made) folder only with --overwrite, or --resume (nothing
        # saved yet: redo it).
        try:
            remove_output(work, WORK_KIND)
            try:
                make_output(work, WORK_KIND)
                write_json(work / SETTINGS_FILE, record(s, c.source_fp, ds.fingerprint), indent=1)
                (work / LOG_FILE).write_text("")
            except OSError:
                shutil.rmtree(work, ignore_errors=True)
                raise
        except OSError as e:
            error = InputError(f"cannot start the work folder '{work}' ({e.strerror or e}); nothing was trained")
    _agree(error)


def _train_steps(acc, trainer: Trainer, *, ds, s: ExtendSettings, plan: Plan, work: Path, start_step: int,
                 progress: bool, flops, dtype: str) -> float:
    """Steps start_step..plan.steps, logged per step and saved every `save_every`; returns the last loss.
    `flops` (`longctx.extend.throughput.ModelFlops`) and the compute `dtype` give the MFU."""
    from tqdm.auto import tqdm

    peak = peak_per_device(acc, s, plan, flops, dtype)
    dp_rank = acc.process_index // s.cp_size
    bar = tqdm(total=plan.steps, initial=start_step, unit="step", disable=not (progress and acc.is_main_process),
               dynamic_ncols=True)
    log_file = None
    if acc.is_main_process:
        try:
            log_file = os.fdopen(open_in_place(work / LOG_FILE), "a", encoding="utf-8")
        except OSError as e:
            raise InputError(f"cannot write the training log {work / LOG_FILE} ({e.strerror or e})") from None
    final_loss = float("nan")
    last_end = time.perf_counter()
    try:
        for step in range(start_step, plan.steps):
            result = train_step(acc, trainer, micro_batches(ds, step, plan, dp_rank), s, plan.world_size, flops)
            final_loss = result.loss
            entry = log_entry(step + 1, result, time.perf_counter() - last_end, plan, peak, flops)
            if log_file is not None:
                append_log_line(log_file, entry, work)
            bar.set_postfix(loss=f"{result.loss:.4f}", tok_s=f"{entry['tokens_per_s']:,.0f}",
                            pad=f"{entry['padding']:.1%}",
                            **({} if entry["mfu"] is None else {"mfu": f"{entry['mfu']:.0%}"}), refresh=False)
            bar.update(1)
            done = step + 1
            if done == plan.steps or (s.save_every and done % s.save_every == 0):
                save_training_state(acc, trainer.module, trainer.optimizer, trainer.scheduler, work, done, plan)
            last_end = time.perf_counter()
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()
    return final_loss


def _log_plan(log, s: ExtendSettings, *, plan: Plan, dtype: str, attn: str, attn_reason: str, acc, work: Path) -> None:
    if s.cp_size > 1:
        log(f"note: {ExtendSettings.flag('cp_size')} {s.cp_size}: torch context parallelism supports only causal "
            "masks, so each sequence is one causal stream (positions 0..seq_len-1, no document masking); labels "
            "still stop at document ends")
    log(f"sequence length {s.seq_len:,}; {plan.sequences_per_step} sequences ({plan.tokens_per_step:,} tokens) per "
        f"optimizer step = {plan.dp_size} data-parallel rank(s) x {plan.accumulation} accumulation x "
        f"{plan.micro_batch_size} micro-batch")
    log(f"{plan.steps:,} steps, {plan.total_tokens:,} tokens; lr {s.lr:g} cosine to {s.lr * s.min_lr_ratio:g} after "
        f"{plan.warmup_steps} warmup steps; {dtype}, world size {plan.world_size}"
        f"{' (FSDP2)' if acc.is_fsdp2 else ''}; work folder {work}")
    log(f"attention {attn} ({attn_reason})")


def extend(s: ExtendSettings, progress: bool = True) -> ExtendResult:
    """Continue training `s.checkpoint` at `s.seq_len` (new RoPE base) and write the result to `s.output`."""
    import torch

    started = time.perf_counter()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world_size > 1:
        from accelerate import PartialState

        PartialState(cpu=not cuda)  # the process group now, so that the ranks agree on the checks below
    with contextlib.ExitStack() as held:  # the output lock, until the output is in place
        error = None
        try:
            checked = _check_before_work(s, world_size, cuda, held)
        except InputError as e:
            error = e
        _agree(error)
        return _train(s, checked, world_size, cuda, progress, started)


def _train(s: ExtendSettings, c: _Checked, world_size: int, cuda: bool, progress: bool,
           started: float) -> ExtendResult:
    import torch

    from longctx.extend.packing import build_packed_dataset

    plan, work = c.plan, work_dir(s.output)
    # before the model: a tokenizer that does not fit it is refused first
    tokenizer = load_tokenizer(c.ckpt, s.trust_remote_code)
    lm = load_training_model(c.ckpt, c.new_cfg, c.attn, s.gradient_checkpointing, s.trust_remote_code)
    flops = model_flops(lm)  # before FSDP2 shards the parameters
    acc, dtype = make_accelerator(s, world_size, cuda, fsdp_plugin(lm) if world_size > 1 else None)
    log = acc.print
    for note in c.notes:
        log(f"note: {note}")
    torch.manual_seed(s.seed)
    random.seed(s.seed)
    _log_plan(log, s, plan=plan, dtype=dtype, attn=c.attn, attn_reason=c.attn_reason, acc=acc, work=work)

    with acc.main_process_first():
        ds = build_packed_dataset(s.data, tokenizer, s.seq_len, num_tokens=plan.total_tokens, short_specs=s.short_data,
                                  short_fraction=s.short_fraction, seed=s.seed, packing=s.packing,
                                  cache_dir=Path(s.cache_dir) if s.cache_dir else cache_dir() / "data",
                                  workers=s.tokenize_workers or available_cores(), log=log)
    _start_work(acc, s, work, c, ds)
    trainer = make_trainer(make_training_module(lm, flatten_batch=c.attn == "flash_attention_2"), s, acc, plan)
    start_step = 0
    if c.resume.step_dir is not None:
        start_step = load_training_state(acc, trainer.module, trainer.optimizer, trainer.scheduler, c.resume.step_dir,
                                         c.resume.state, log)
        if acc.is_main_process:  # drop log lines of steps after the saved state (they will be redone)
            write_atomic(work / LOG_FILE, "".join(f"{line}\n" for line in c.resume.log))
    elif s.resume:
        log(f"{ExtendSettings.flag('resume')}: nothing saved in '{work}' yet; starting from step 0")

    final_loss = _train_steps(acc, trainer, ds=ds, s=s, plan=plan, work=work, start_step=start_step, progress=progress,
                              flops=flops, dtype=dtype)
    if start_step == plan.steps:
        log(f"the run in '{work}' had already finished all {plan.steps} steps; writing the output")
        final_loss = loads(c.resume.log[-1])["loss"]
    error = None
    try:
        write_output(acc, trainer.module, ckpt=c.ckpt, new_cfg=c.new_cfg, s=s, plan=plan, work=work,
                     extra={"source_fingerprint": c.source_fp, "data_fingerprint": ds.fingerprint,
                            "data_stats": ds.stats, "attention": c.attn, "attention_reason": c.attn_reason,
                            "dtype": dtype})
    except OSError as e:
        error = s.error(f"could not write the output '{s.output}' ({e.strerror or e}); the trained state is kept "
                        f"in {work}: free space and rerun with {ref('resume')} to write the output")
    _agree(error)
    acc.wait_for_everyone()
    seconds = time.perf_counter() - started
    log(f"wrote {s.output} ({plan.steps} steps, {plan.total_tokens:,} tokens, final loss {final_loss:.4f}, "
        f"{seconds:.1f} s); training state in {work}")
    return ExtendResult(Path(s.output), plan.steps, plan.total_tokens, final_loss, Path(s.output) / LOG_FILE, seconds)
