"""Multi-process training from a recipe: the `accelerate launch` or `torchrun` command line of a training job,
and which machine this is."""

from __future__ import annotations

import dataclasses
import os
import sys

from longctx.core.settings import Settings
from longctx.recipe.types import Recipe


def machine_rank(recipe: Recipe) -> int:
    rank = recipe.launcher.machine_rank
    return rank if rank is not None else int(os.environ.get("MACHINE_RANK", "0"))


def launch_command(recipe: Recipe, job: Settings, resume: bool = False) -> tuple[list[str], list[str]]:
    """(the command line shown, the one run) of a multi-process training job: `accelerate launch ... -m
    longctx extend ...` or `torchrun ... -m longctx extend ...`, the job's arguments derived from its settings."""
    ln = recipe.launcher
    machines, procs, rank = ln.num_machines, ln.num_processes, machine_rank(recipe)
    if ln.launcher == "accelerate":
        head = ["--num_processes", str(procs), "--num_machines", str(machines)]
        if machines > 1:
            head += ["--machine_rank", str(rank), "--main_process_ip", ln.main_process_ip,
                     "--main_process_port", str(ln.main_process_port)]
        shown, run = ["accelerate", "launch"], [sys.executable, "-m", "accelerate.commands.launch"]
    else:
        head = ["--nnodes", str(machines), "--nproc_per_node", str(procs // machines)]
        if machines > 1:
            head += ["--node_rank", str(rank), "--master_addr", ln.main_process_ip,
                     "--master_port", str(ln.main_process_port)]
        shown, run = ["torchrun"], [sys.executable, "-m", "torch.distributed.run"]
    tail = [*head, "-m", "longctx", "extend", *dataclasses.replace(job, resume=resume).to_args()]
    return [*shown, *tail], [*run, *tail]
