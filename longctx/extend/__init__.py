"""`longctx extend`: continued training at a longer length with a new RoPE base (accelerate; FSDP2 on many
ranks): settings, data tokenization and packing, the loop, resumable state, the output checkpoint."""
