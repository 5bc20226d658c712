"""Multi-process training from a recipe: the `accelerate launch` or `torchrun` command line of a training job,
and which machine this is."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from longctx.core.errors import InputError, ProcessFailed
from longctx.core.processes import children_bound
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


# Runs the launcher module named after it as `python -m` would, once importing longctx has bound this process to
# the recipe's (`longctx.core.processes.adopt`): the launcher dies with the recipe, and its ranks with it.
_BOUND = ("import runpy, sys, longctx; module = sys.argv.pop(1); sys.argv[0] = module; "
          "runpy.run_module(module, run_name='__main__', alter_sys=True)")
_REFUSAL = b"Error: "


def run_launched(cmd: list[str], label: str, env: dict[str, str] | None = None) -> None:
    """Run the launch line `cmd` (from `launch_command`) bound to this process: kill -9 of the recipe ends the
    launcher and every rank. What it prints passes through as it comes; a rank's refusal ("Error: ..." and exit
    code 2) becomes this stage's one line (InputError) and the launcher's failure report after it is not shown;
    any other failure is ProcessFailed, its output above. `env`: variables set for it beyond this process's."""
    assert cmd[1] == "-m", cmd
    with children_bound():
        # one thread per rank unless said otherwise: what torchrun sets, without the banner it prints about it
        env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
        proc = subprocess.Popen([cmd[0], "-c", _BOUND, *cmd[2:]], stderr=subprocess.PIPE, env=env)
    try:
        refusal = _relay(proc.stderr.fileno())
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the launcher stops its ranks on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stderr.close()
    if code == 0:
        return
    if refusal is not None:
        raise InputError(f"{label}: {refusal}")
    raise ProcessFailed(f"{label}: the launched processes exited with code {code}; their output is above")


def _relay(fd: int) -> str | None:
    """Copy what arrives on `fd` to this process's standard error as it comes (a progress bar redraws after a
    carriage return, without a newline) until a line starts with "Error: ", then only read to the end; that
    line's text (the refusal), or None."""
    pending, inside = b"", False  # bytes not yet copied; whether they continue a line already partly copied
    while chunk := os.read(fd, 1 << 16):
        pending += chunk
        while pending:
            cut = min((i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0), default=-1)
            segment = pending if cut < 0 else pending[:cut + 1]
            if not inside and cut >= 0 and segment.startswith(_REFUSAL):
                while os.read(fd, 1 << 16):  # the launcher's report of the failed ranks: not shown
                    pass
                return segment[len(_REFUSAL):].decode(errors="replace").strip()
            if not inside and cut < 0 and (_REFUSAL.startswith(segment) or segment.startswith(_REFUSAL)):
                break  # may yet be a refusal: wait for the rest of the line
            sys.stderr.buffer.write(segment)
            sys.stderr.flush()
            pending, inside = pending[len(segment):], cut < 0
    if pending:
        sys.stderr.buffer.write(pending)
        sys.stderr.flush()
    return None
