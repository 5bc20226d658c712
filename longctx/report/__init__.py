"""Result files -> tables and plots: a RULER run's report, `compare`, sinks tables, training-loss curves.
Reads files only; never runs a model."""
