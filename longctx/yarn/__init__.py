"""`longctx yarn`: static YaRN (Peng et al., arXiv 2309.00071) on a checkpoint's config, as transformers
and vLLM implement it, plus the reference math that tests check both engines against."""
