"""RoPE: what a checkpoint's config says about positions, what transformers builds from it, and how the verbs
change it.

- `types`: one record per RoPE type (the keys it reads, whether it has an original length, what a new base and a
  YaRN rescale do to it, its reference frequencies, its name in messages); nothing else compares type names.
- `settings`: `RopeSettings`, the RoPE of a config as one value, and the lengths it reaches.
- `config`: reading and writing it in config.json, both forms (transformers 5's `rope_parameters`, the 4.x keys).
- `layers`: configs with a RoPE per layer type (Gemma-3's global and sliding layers).
- `built`: what the rotary modules of the model transformers builds compute, per layer type.
- `reference`: RoPE's frequencies from the papers' formulas (YaRN's, and its LongRoPE form).
"""
