"""Text for training and analysis: document sources (`--data SPEC`) and the built-in synthetic corpora."""
