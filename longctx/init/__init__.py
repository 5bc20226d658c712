"""`longctx init`: freshly initialised checkpoints from named shapes (presets) and attention variants."""
