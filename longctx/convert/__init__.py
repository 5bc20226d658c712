"""`longctx convert`: checkpoints in other layouts (the paper's released ones) into the gated family."""
