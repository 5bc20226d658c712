"""Reference YaRN math (Peng et al., arXiv 2309.00071, §3.2-3.4) in fp32, in the order of operations
transformers (`_compute_yarn_parameters`) and vLLM (`YaRNScalingRotaryEmbedding`) use, so tests can check
both engines against it to the last bit. Models always use the engines' own RoPE code.

YaRN written as LongRoPE (for architectures whose transformers config class turns rope_type "yarn" into
"longrope", such as Phi-3) is `yarn_longrope_factors` evaluated by `longrope_inv_freq`."""

from __future__ import annotations

import math


def yarn_correction_range(dim: int, base: float, original: int, beta_fast: float = 32, beta_slow: float = 1,
                          truncate: bool = True) -> tuple[float, float]:
    """Dimension pair range [low, high] whose ramp goes from extrapolation to interpolation.

    d(r) = D·ln(L/(2πr)) / (2·ln b); low = floor(d(beta_fast)), high = ceil(d(beta_slow)) when
    truncating; clamped to [0, D−1] (D−1, as transformers and vLLM do).
    """
    def d(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = d(beta_fast), d(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_attention_scaling(factor: float) -> float:
    """mscale = 0.1·ln(s) + 1, multiplied into both cos and sin (so logits scale by its square)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """DeepSeek's `yarn_get_mscale`: 0.1·mscale·ln(s) + 1 (1 for s <= 1); `yarn_attention_scaling` is mscale 1."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None,
                          attention_factor: float | None = None) -> float:
    """The factor YaRN multiplies cos and sin by: `attention_factor` when given; with both DeepSeek keys
    mscale(s, mscale) / mscale(s, mscale_all_dim) (DeepSeek-V2/V3's `DeepseekV2YarnRotaryEmbedding`); else
    0.1·ln(s) + 1 (the paper's √(1/t))."""
    if attention_factor is not None:
        return attention_factor
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_attention_scaling(factor)


def mla_softmax_multiplier(factor: float, mscale_all_dim: float | None) -> float:
    """What DeepSeek's MLA attention multiplies its softmax scale 1/√(qk_head_dim) by under YaRN:
    mscale(s, mscale_all_dim)² (1 without mscale_all_dim), as DeepSeek-V2/V3's `softmax_scale` and
    transformers' `yarn_apply_mscale` (models/deepseek_v3/modeling_deepseek_v3.py) compute it."""
    return yarn_get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original: int, beta_fast: float = 32,
                  beta_slow: float = 1, truncate: bool = True):
    """inv_freq_i = θ_i/s·ramp_i + θ_i·(1 − ramp_i), θ_i = b^(−2i/D), in fp32 (torch tensor, D/2).

    Evaluated in the same order of fp32 operations as transformers and vLLM (1/(s·b^(2i/D)) rather
    than θ_i/s), so the three agree to the last bit rather than to an ulp.
    """
    import torch

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    keep = yarn_extrapolation_share(dim, base, original, beta_fast, beta_slow, truncate)
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def yarn_extrapolation_share(dim: int, base: float, original: int, beta_fast: float = 32, beta_slow: float = 1,
                             truncate: bool = True):
    """e_i = 1 − ramp_i, the share of the original frequency each pair keeps (fp32 torch tensor, D/2)."""
    import torch

    low, high = yarn_correction_range(dim, base, original, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return 1 - ramp


def longrope_inv_freq(factors, dim: int, base: float):
    """LongRoPE's inv_freq_i = 1/(f_i·b^(2i/D)) in fp32, in the order of operations of transformers
    (`_compute_longrope_parameters`) and vLLM (`Phi3LongRoPEScaledRotaryEmbedding._compute_inv_freq`)."""
    import torch

    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** (torch.arange(0, dim, 2, dtype=torch.float32)
                                                                         / dim))


def yarn_longrope_factors(dim: int, base: float, factor: float, original: int, beta_fast: float = 32,
                          beta_slow: float = 1, truncate: bool = True) -> list[float]:
    """YaRN as LongRoPE per-pair factors: θ_i·((1 − e_i)/s + e_i) = θ_i/f_i, so f_i = s/((1 − e_i) + e_i·s)
    (1 where YaRN extrapolates, s where it interpolates).

    Each f_i is the fp32 number (as a Python float, which JSON keeps exactly) nearest that ideal for which
    `longrope_inv_freq` gives YaRN's fp32 inv_freq (`yarn_inv_freq`) bit for bit. On the ramp such a number
    does not always exist (the two fp32 roundings of 1/(f·b^(2i/D)) skip some values); there the nearest
    f_i is kept and the frequency is 1 ulp from YaRN's.
    """
    import torch

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    target = yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow, truncate)
    keep = yarn_extrapolation_share(dim, base, original, beta_fast, beta_slow, truncate).double()
    ideal = (factor / ((1 - keep) + keep * factor)).float()
    best, found = ideal.clone(), 1.0 / (ideal * pos_freqs) == target
    up = down = ideal
    for _ in range(8):  # nearest candidates first
        up, down = torch.nextafter(up, torch.tensor(math.inf)), torch.nextafter(down, torch.tensor(-math.inf))
        for candidate in (up, down):
            hit = ~found & (1.0 / (candidate * pos_freqs) == target)
            best, found = torch.where(hit, candidate, best), found | hit
    return [float(f) for f in best]


def rope_cos_sin(inv_freq, positions, attention_scaling: float = 1.0):
    """cos and sin (fp32, shape [len(positions), D/2]) at integer positions, scaled by mscale."""
    import torch

    freqs = torch.as_tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    return freqs.cos() * attention_scaling, freqs.sin() * attention_scaling
