"""RULER's tasks as data: one `TaskSpec` per task (name, generator, arguments, metric, shortest length, relative
work), each generator one `Generator` (its module, template, answer prefix, budget of generated tokens, the data it
reads). Adding a task that an existing generator makes is one `TaskSpec` in `_SPECS`; a new generator is one
`Generator` in `GENERATORS` plus its module (`generate(ctx)`, and `check_data(spec, data, samples)` where data
must be checked before any file is made) and its upstream template in `constants.TASK_TEMPLATES`.

The standard set is upstream's: arguments of NVIDIA/RULER `scripts/synthetic.yaml` @ c3f5e3b; budgets and
templates from `scripts/data/synthetic/constants.py`; metrics from `scripts/eval/synthetic/constants.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ruler_tasks.constants import TASK_TEMPLATES, UPSTREAM_COMMIT
from ruler_tasks.errors import RulerInputError

# Bumped whenever our output for a task changes for the same inputs (it then never reuses old files).
GENERATOR_VERSION = 1


def _no_data(args: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Generator:
    """One of upstream's sample generators (`scripts/data/synthetic/<name>.py`), as `ruler_tasks.<module>` runs
    it."""

    name: str  # upstream's key of its template (`constants.TASK_TEMPLATES`)
    module: str  # `ruler_tasks.<module>`: `generate(ctx)`, and optionally `check_data(spec, data, samples)`
    data: Callable[[Mapping[str, Any]], tuple[str, ...]] = _no_data  # the data sources it reads, by task arguments
    english_words: bool = False  # it draws from the English word list (whose checksum then keys the task file)

    @property
    def template(self) -> str:
        return TASK_TEMPLATES[self.name]["template"]

    @property
    def answer_prefix(self) -> str:
        return TASK_TEMPLATES[self.name]["answer_prefix"]

    @property
    def tokens_to_generate(self) -> int:
        return TASK_TEMPLATES[self.name]["tokens_to_generate"]


GENERATORS: Mapping[str, Generator] = MappingProxyType({g.name: g for g in (
    Generator("niah", "niah", data=lambda args: ("essay",) if args.get("type_haystack") == "essay" else ()),
    Generator("variable_tracking", "variable_tracking"),
    Generator("common_words_extraction", "common_words", english_words=True),
    Generator("freq_words_extraction", "freq_words"),
    Generator("qa", "qa", data=lambda args: (args["dataset"],)),
)})


@dataclass(frozen=True)
class TaskSpec:
    name: str
    generator: Generator
    args: Mapping[str, Any] = field(default_factory=dict)
    metric: str = "string_match_all"  # `longctx.eval.scoring.METRICS`
    # Shortest max length we accept: below it the generator cannot fit its smallest step
    # (upstream would loop forever in its retry loop).
    min_length: int = 1024
    # How long a sample takes to make, relative to others (`PrepareResult.timings` at 128k): the longest
    # jobs start first, so that no worker is left with a long one at the end.
    work: float = 1.0

    @property
    def tokens_to_generate(self) -> int:
        return self.generator.tokens_to_generate

    @property
    def version(self) -> str:
        return f"ruler@{UPSTREAM_COMMIT[:7]}+longctx{GENERATOR_VERSION}"

    @property
    def needs(self) -> tuple[str, ...]:
        """External data sources the task reads (essay, squad, hotpotqa)."""
        return self.generator.data(self.args)


def _niah(name, haystack, k, v, nk=1, nv=1, nq=1, work=1.0):
    args = dict(type_haystack=haystack, type_needle_k=k, type_needle_v=v,
                num_needle_k=nk, num_needle_v=nv, num_needle_q=nq)
    return TaskSpec(name, GENERATORS["niah"], MappingProxyType(args), work=work)


_SPECS = [
    _niah("niah_single_1", "noise", "words", "numbers", work=0.3),
    _niah("niah_single_2", "essay", "words", "numbers", work=0.9),
    _niah("niah_single_3", "essay", "words", "uuids", work=0.8),
    _niah("niah_multikey_1", "essay", "words", "numbers", nk=4, work=2.1),
    _niah("niah_multikey_2", "needle", "words", "numbers", work=2.7),
    _niah("niah_multikey_3", "needle", "uuids", "uuids", work=2.5),
    _niah("niah_multivalue", "essay", "words", "numbers", nv=4, work=2.1),
    _niah("niah_multiquery", "essay", "words", "numbers", nq=4, work=1.6),
    TaskSpec("vt", GENERATORS["variable_tracking"],
             MappingProxyType(dict(type_haystack="noise", num_chains=1, num_hops=4)), work=0.5),
    TaskSpec("cwe", GENERATORS["common_words_extraction"], MappingProxyType(dict(freq_cw=30, freq_ucw=3, num_cw=10)),
             work=1.2),
    TaskSpec("fwe", GENERATORS["freq_words_extraction"], MappingProxyType(dict(alpha=2.0)), work=1.5),
    TaskSpec("qa_1", GENERATORS["qa"], MappingProxyType(dict(dataset="squad")), metric="string_match_part",
             min_length=2048, work=0.3),
    TaskSpec("qa_2", GENERATORS["qa"], MappingProxyType(dict(dataset="hotpotqa")), metric="string_match_part",
             min_length=2048, work=0.3),
]

TASKS: Mapping[str, TaskSpec] = MappingProxyType({s.name: s for s in _SPECS})
TASK_NAMES: tuple[str, ...] = tuple(TASKS)  # the standard set, in RULER's synthetic.yaml order


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise RulerInputError(
            f"unknown RULER task '{name}'; choose from: {', '.join(TASK_NAMES)}"
        ) from None


def resolve_tasks(tasks) -> list[TaskSpec]:
    """Task specs for names (a list, or a comma-separated string; None or 'all' = every task of `TASKS`)."""
    if tasks is None or tasks == "all" or (not isinstance(tasks, str) and list(tasks) == ["all"]):
        return [TASKS[n] for n in TASK_NAMES]
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",")]
    names = [t.strip() for t in tasks if t and t.strip()]
    if not names:
        raise RulerInputError("no RULER task given; name at least one of: " + ", ".join(TASK_NAMES))
    out, seen = [], set()
    for n in names:
        spec = get_task(n)
        if n not in seen:
            seen.add(n)
            out.append(spec)
    return out
