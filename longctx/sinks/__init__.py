"""`longctx sinks`: attention sinks, massive activations and gate sparsity of a checkpoint (Qiu et al. 2025,
§4.2-4.3, Table 4), measured into `sinks.json`; `longctx.report` turns that into tables and plots."""
