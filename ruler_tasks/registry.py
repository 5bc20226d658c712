"""The 13 standard RULER tasks: name -> generator, arguments, generation budget, metric, version.

Arguments are those of NVIDIA/RULER `scripts/synthetic.yaml` @ c3f5e3b; budgets and templates come
from `scripts/data/synthetic/constants.py`; metrics from `scripts/eval/synthetic/constants.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ruler_tasks.constants import TASK_TEMPLATES, UPSTREAM_COMMIT
from ruler_tasks.errors import RulerInputError

# Bumped whenever our output for a task changes for the same inputs (it then never reuses old files).
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class TaskSpec:
    name: str
    generator: str  # key of TASK_TEMPLATES: niah, variable_tracking, common_words_extraction, ...
    args: Mapping[str, Any] = field(default_factory=dict)
    metric: str = "string_match_all"
    # Shortest max length we accept: below it the generator cannot fit its smallest step
    # (upstream would loop forever in its retry loop).
    min_length: int = 1024
    # How long a sample takes to make, relative to others (`PrepareResult.timings` at 128k): the longest
    # jobs start first, so that no worker is left with a long one at the end.
    work: float = 1.0

    @property
    def tokens_to_generate(self) -> int:
        return TASK_TEMPLATES[self.generator]["tokens_to_generate"]

    @property
    def version(self) -> str:
        return f"ruler@{UPSTREAM_COMMIT[:7]}+longctx{GENERATOR_VERSION}"

    @property
    def needs(self) -> tuple[str, ...]:
        """External data sources the task reads (essay, squad, hotpotqa)."""
        if self.generator == "niah" and self.args.get("type_haystack") == "essay":
            return ("essay",)
        if self.generator == "qa":
            return (self.args["dataset"],)
        return ()


def _niah(name, haystack, k, v, nk=1, nv=1, nq=1, work=1.0):
    args = dict(type_haystack=haystack, type_needle_k=k, type_needle_v=v,
                num_needle_k=nk, num_needle_v=nv, num_needle_q=nq)
    return TaskSpec(name, "niah", MappingProxyType(args), work=work)


_SPECS = [
    _niah("niah_single_1", "noise", "words", "numbers", work=0.3),
    _niah("niah_single_2", "essay", "words", "numbers", work=0.9),
    _niah("niah_single_3", "essay", "words", "uuids", work=0.8),
    _niah("niah_multikey_1", "essay", "words", "numbers", nk=4, work=2.1),
    _niah("niah_multikey_2", "needle", "words", "numbers", work=2.7),
    _niah("niah_multikey_3", "needle", "uuids", "uuids", work=2.5),
    _niah("niah_multivalue", "essay", "words", "numbers", nv=4, work=2.1),
    _niah("niah_multiquery", "essay", "words", "numbers", nq=4, work=1.6),
    TaskSpec("vt", "variable_tracking", MappingProxyType(dict(type_haystack="noise", num_chains=1, num_hops=4)),
             work=0.5),
    TaskSpec("cwe", "common_words_extraction", MappingProxyType(dict(freq_cw=30, freq_ucw=3, num_cw=10)), work=1.2),
    TaskSpec("fwe", "freq_words_extraction", MappingProxyType(dict(alpha=2.0)), work=1.5),
    TaskSpec("qa_1", "qa", MappingProxyType(dict(dataset="squad")), metric="string_match_part", min_length=2048,
             work=0.3),
    TaskSpec("qa_2", "qa", MappingProxyType(dict(dataset="hotpotqa")), metric="string_match_part", min_length=2048,
             work=0.3),
]

TASKS: Mapping[str, TaskSpec] = MappingProxyType({s.name: s for s in _SPECS})
TASK_NAMES: tuple[str, ...] = tuple(TASKS)  # RULER's synthetic.yaml order


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise RulerInputError(
            f"unknown RULER task '{name}'; choose from: {', '.join(TASK_NAMES)}"
        ) from None


def resolve_tasks(tasks) -> list[TaskSpec]:
    """Task specs for names (a list, or a comma-separated string; None or 'all' = all 13)."""
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
