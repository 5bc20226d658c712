"""RULER task generators."""
