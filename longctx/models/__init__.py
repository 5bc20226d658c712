"""The gated-attention model family (Qiu et al. 2025, arXiv 2505.06708) for transformers and vLLM."""
