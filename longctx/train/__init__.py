"""`longctx extend`: training data (sources, tokenization cache, packing) and the accelerate/FSDP2 training loop."""
