"""The gate design space of Qiu et al. 2025 ("Gated Attention for LLMs", arXiv 2505.06708, §2.2, §3-4, Tables 1,
3 and 4) as one specification, how a config.json stores it, and the named rows of the paper's tables.

A gate is `Y' = Y * act(X W)` (multiplicative) or `Y' = Y + act(X W)` (additive), where X is the layer's
pre-norm input (the `input_layernorm` output that also feeds q/k/v) and Y is one of the attention's tensors:

| position | Y | heads it has |
| --- | --- | --- |
| `sdpa` (G1) | each head's attention output, before the heads are concatenated for `o_proj` | query heads |
| `value` (G2) | the values after `v_proj` (the cache keeps the gated values) | key/value heads |
| `key` (G3) | the keys after `k_proj`, `k_norm` and RoPE (the cache keeps the gated keys) | key/value heads |
| `query` (G4) | the queries after `q_proj`, `q_norm` and RoPE | query heads |
| `dense` (G5) | the output of `o_proj` | none |

Keys and queries are gated after their per-head RMSNorm and RoPE, on what attention reads: a headwise gate
before a per-head RMSNorm would be normalised away, and an elementwise one before RoPE would be rotated into
other dimensions.

- granularity: `elementwise` (a score per element of Y) or `headwise` (one score per head);
- heads: `specific` (each head its own scores) or `shared` (the paper averages the per-head scores over the
  heads, §2.2: n x q x d_k -> n x d_k, so the weights are the same size and every head gets the mean);
- form: `multiplicative` or `additive`;
- activation: `sigmoid`, `silu` (x sigmoid(x)), `identity`, `ns-sigmoid` (0.5 + 0.5 sigmoid(x), Table 4 row 7);
- source: `input` (from X) or `free` (input-independent: learnt scores of the gate's shape, zero-initialised,
  Table 4 row 6).

Besides gates, two parameter-free (or nearly) non-linearities at G1 from Table 3: `silu` (Y' = SiLU(Y), row 6)
and `rmsnorm` (per-head RMSNorm of Y with one weight vector of head_dim, the "group norm" row).

config.json: the two gates the official code has keep its keys (`elementwise_attn_output_gate`,
`headwise_attn_output_gate`: G1, head-specific, multiplicative, sigmoid, from X), so checkpoints written
before this module and official conversions read the same; every other gate is `attn_gate: {...}` with the
fields above (`kind` "gate", "silu" or "rmsnorm").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longctx.core.errors import InputError

CONFIG_KEY = "attn_gate"
LEGACY_KEYS = {"elementwise": "elementwise_attn_output_gate", "headwise": "headwise_attn_output_gate"}
POSITIONS = {"sdpa": "G1", "value": "G2", "key": "G3", "query": "G4", "dense": "G5"}
KINDS = ("gate", "silu", "rmsnorm")
CHOICES = {"kind": KINDS, "position": tuple(POSITIONS), "granularity": ("elementwise", "headwise"),
           "heads": ("specific", "shared"), "form": ("multiplicative", "additive"),
           "activation": ("sigmoid", "silu", "identity", "ns-sigmoid"), "source": ("input", "free")}


@dataclass(frozen=True)
class GateSpec:
    """One point of the gate design space (the module's docstring says what each field means)."""

    kind: str = "gate"
    position: str = "sdpa"
    granularity: str = "elementwise"
    heads: str = "specific"
    form: str = "multiplicative"
    activation: str = "sigmoid"
    source: str = "input"

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise InputError(problem)

    @property
    def legacy(self) -> str | None:
        """'elementwise' or 'headwise' when this is one of the official code's two gates, else None."""
        if dataclasses.replace(self, granularity="elementwise") == GateSpec():
            return self.granularity
        return None

    @property
    def head_kind(self) -> str | None:
        """Whose heads Y has: "query", "kv" or None (G5, or a parameter-free non-linearity's own)."""
        if self.kind != "gate":
            return "query"
        return {"sdpa": "query", "query": "query", "value": "kv", "key": "kv"}.get(self.position)

    def position_heads(self, heads: int, kv_heads: int) -> int:
        """The heads of the tensor the gate scales: `heads` (query heads: G1, G4), `kv_heads` (G2, G3), 0 (G5)."""
        kind = self.head_kind
        return 0 if kind is None else heads if kind == "query" else kv_heads

    def width(self, heads: int, kv_heads: int, head_dim: int, hidden_size: int) -> int:
        """Outputs of the gate's projection (or its free scores) in a model of these sizes; 0 without parameters
        to shape (the parameter-free non-linearities)."""
        if self.kind != "gate":
            return 0
        if self.position == "dense":
            return hidden_size
        n = self.position_heads(heads, kv_heads)
        return n * head_dim if self.granularity == "elementwise" else n

    def scored_heads(self, heads: int, kv_heads: int) -> tuple[int, str]:
        """How many heads the applied scores have, and whose they are: the position's own heads, or one when the
        gate is head-shared or at G5."""
        if self.heads == "shared":
            return 1, "all heads (shared)"
        if self.position == "dense":
            return 1, "the hidden state (G5)"
        n = self.position_heads(heads, kv_heads)
        return n, "query heads" if self.head_kind == "query" else "key/value heads"

    def words(self) -> str:
        """The spec in words, as `longctx info` shows it."""
        if self.kind == "silu":
            return "SiLU on each head's attention output (G1, no parameters)"
        if self.kind == "rmsnorm":
            return "per-head RMSNorm of the attention output (G1, a head_dim weight)"
        heads = "" if self.position == "dense" else f", head-{self.heads}"
        source = "from the layer input" if self.source == "input" else "input-independent (learnt, zero-initialised)"
        return (f"{self.form} {self.activation} gate, {self.granularity}{heads}, at {POSITIONS[self.position]} "
                f"({self.position}), {source}")

    def as_config(self) -> dict[str, Any]:
        """The config.json keys that store this spec (the legacy flags false when `attn_gate` is written)."""
        flags = {key: self.legacy == name for name, key in LEGACY_KEYS.items()}
        return flags if self.legacy else {**flags, CONFIG_KEY: dataclasses.asdict(self)}


def _problem(spec: GateSpec) -> str | None:
    """What makes no sense in `spec`, naming the parts (None: nothing)."""
    for name, allowed in CHOICES.items():
        value = getattr(spec, name)
        if value not in allowed:
            return f"gate {name} '{value}' is not one of {', '.join(allowed)}"
    if spec.kind != "gate":
        defaults = GateSpec.__dataclass_fields__
        set_fields = [f for f in CHOICES if f != "kind" and getattr(spec, f) != defaults[f].default]
        if spec.position != "sdpa":
            return f"gate kind '{spec.kind}' is a non-linearity at sdpa (G1) only, not at {spec.position}"
        if set_fields:
            return (f"gate kind '{spec.kind}' has no parameters to shape: drop "
                    f"{', '.join(f'{f}={getattr(spec, f)}' for f in set_fields)}")
        return None
    if spec.position == "dense" and spec.granularity == "headwise":
        return "a headwise gate needs heads: dense (G5) is after o_proj has mixed them; use granularity elementwise"
    if spec.position == "dense" and spec.heads == "shared":
        return "heads=shared needs heads: dense (G5) is after o_proj has mixed them; use heads specific"
    return None


# The paper's rows by name: Table 1 (positions, granularity, sharing, form, activation), Table 3 (the
# non-linearity rows) and Table 4 (the attention-sink rows). `baseline` is no gate at all.
NAMED: dict[str, GateSpec | None] = {
    "baseline": None,
    "elementwise": GateSpec(),
    "headwise": GateSpec(granularity="headwise"),
    "head-shared": GateSpec(heads="shared"),
    "headwise-shared": GateSpec(granularity="headwise", heads="shared"),
    "value-elementwise": GateSpec(position="value"),
    "value-headwise": GateSpec(position="value", granularity="headwise"),
    "key-elementwise": GateSpec(position="key"),
    "query-elementwise": GateSpec(position="query"),
    "dense-elementwise": GateSpec(position="dense"),
    "input-independent": GateSpec(source="free"),
    "ns-sigmoid": GateSpec(activation="ns-sigmoid"),
    "silu-gate": GateSpec(activation="silu"),
    "additive-silu": GateSpec(form="additive", activation="silu"),
    "additive": GateSpec(form="additive", activation="identity"),
    "silu": GateSpec(kind="silu"),
    "rmsnorm": GateSpec(kind="rmsnorm"),
}

# The paper's row each name reproduces (README's model section, `longctx info`).
PAPER_ROWS = {
    "baseline": "Tables 1-5: baseline",
    "elementwise": "Table 1 row 5 / Table 4 'SDPA elementwise' (the recommended G1 gate)",
    "headwise": "Table 1 / Table 4 'SDPA headwise'",
    "head-shared": "Table 1 / Table 4 'SDPA elem. head-shared'",
    "headwise-shared": "Table 1 head-shared headwise",
    "value-elementwise": "Table 1 G2 / Table 4 'v elementwise'",
    "value-headwise": "Table 1 G2 headwise",
    "key-elementwise": "Table 1 G3",
    "query-elementwise": "Table 1 G4",
    "dense-elementwise": "Table 1 G5",
    "input-independent": "Table 4 'input-independent'",
    "ns-sigmoid": "Table 4 'NS-sigmoid'",
    "silu-gate": "Table 1 row 15 (SiLU instead of sigmoid)",
    "additive-silu": "Table 1 additive SiLU gate / Table 3",
    "additive": "Table 3 row 7 (additive, no SiLU)",
    "silu": "Table 3 row 6 (SiLU at G1, no parameters)",
    "rmsnorm": "Table 3 (per-head RMSNorm of the SDPA output)",
}


def parse_gate(text: str) -> GateSpec | None:
    """A named row (`NAMED`) or `field=value,...` over the defaults; None for the baseline. InputError names what
    is wrong."""
    text = text.strip()
    if text in NAMED:
        return NAMED[text]
    if "=" not in text:
        raise InputError(f"unknown attention variant '{text}'; choose one of {', '.join(NAMED)}, or give the gate "
                         f"as field=value,... over {', '.join(CHOICES)}")
    fields: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in CHOICES:
            raise InputError(f"'{part.strip()}' in the gate '{text}' is not field=value with a field of "
                             f"{', '.join(CHOICES)}")
        if name in fields:
            raise InputError(f"the gate '{text}' gives {name} twice")
        fields[name] = value
    return GateSpec(**fields)


def gate_of(config: Any) -> GateSpec | None:
    """The gate a config.json dict or a config object asks for (None: the baseline). InputError when it is
    malformed or asks for two."""
    get = config.get if isinstance(config, Mapping) else lambda key: getattr(config, key, None)
    stored, legacy = get(CONFIG_KEY), [name for name, key in LEGACY_KEYS.items() if get(key)]
    if len(legacy) > 1:
        raise InputError("config asks for both headwise_attn_output_gate and elementwise_attn_output_gate; set at "
                         "most one of them (neither = baseline)")
    if stored is not None:
        if legacy:
            raise InputError(f"config asks for {LEGACY_KEYS[legacy[0]]} and an {CONFIG_KEY} gate; keep one of them")
        if not isinstance(stored, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in stored.items()):
            raise InputError(f"config's {CONFIG_KEY} is not an object of text fields ({', '.join(CHOICES)})")
        unknown = sorted(set(stored) - set(CHOICES))
        if unknown:
            raise InputError(f"config's {CONFIG_KEY} has unknown fields {', '.join(unknown)}; its fields are "
                             f"{', '.join(CHOICES)}")
        return GateSpec(**stored)
    return NAMED[legacy[0]] if legacy else None


def gate_name(spec: GateSpec | None) -> str:
    """The named row a spec is (`NAMED`), or its fields as `parse_gate` reads them."""
    for name, named in NAMED.items():
        if named == spec:
            return name
    defaults = GateSpec()
    return ",".join(f"{f}={getattr(spec, f)}" for f in CHOICES if getattr(spec, f) != getattr(defaults, f))
