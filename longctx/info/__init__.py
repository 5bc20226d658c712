"""The `info` verb: what a checkpoint is (architecture, attention, RoPE as read and as built, lengths, sliding
windows, size, fingerprint), and the `ModelInfo` that result files record of the checkpoint they measured."""
