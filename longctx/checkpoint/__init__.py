"""Checkpoint directories: config and RoPE settings, fingerprints, side files, provenance, the model and
tokenizer loaders, and what `longctx info` shows."""
