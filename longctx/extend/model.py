"""The model side of `extend`: the loss-returning training module, the attention implementation, FSDP2 and
the accelerator.

One code path for a laptop CPU, one GPU and many nodes:
- 1 process: plain accelerate (fp32 on CPU, bf16 autocast on GPU).
- >1 process (`torchrun` / `accelerate launch`): FSDP2 full sharding of every decoder layer
  (`FullyShardedDataParallelPlugin(fsdp_version=2)`), on GPUs with NCCL and on CPUs with gloo.
- `cp_size > 1`: accelerate's torch context parallelism (`ParallelismConfig(cp_size=...)`), GPUs only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.checkpoint.load import load_model
from longctx.core.errors import SettingError, ref
from longctx.extend.settings import ExtendSettings


def _training_module_class():
    import torch

    from longctx.extend.loss import DEFAULT_CHUNK_TOKENS, chunked_cross_entropy

    class _TrainingModule(torch.nn.Module):
        """A causal LM whose forward returns the summed chunked cross-entropy instead of logits.

        FSDP2 gathers a module's parameters in its forward hooks, so the LM head used by the chunked
        loss must be called inside this module's forward (the root FSDP unit), not after it.
        """

        def __init__(self, lm, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, flatten_batch: bool = False):
            super().__init__()
            self.lm = lm
            self.chunk_tokens = chunk_tokens
            # flash-attention 2 finds document boundaries from position_ids only for batch size 1,
            # so a micro-batch is laid end to end; SDPA builds a block-diagonal mask per row and
            # FlexAttention one BlockMask with a row per sequence (transformers masking_utils.create_causal_mask).
            self.flatten_batch = flatten_batch

        def hidden_states(self, input_ids, position_ids):
            if self.flatten_batch:
                input_ids, position_ids = input_ids.reshape(1, -1), position_ids.reshape(1, -1)
            # attention_mask=None + position_ids restarting at 0 => transformers masks each document
            # separately (masking_utils.find_packed_sequence_indices); use_cache=False, since a cache
            # object disables that detection.
            return self.lm.get_decoder()(input_ids=input_ids, position_ids=position_ids, attention_mask=None,
                                         use_cache=False).last_hidden_state

        def forward(self, input_ids, position_ids, shift_labels):
            hidden = self.hidden_states(input_ids, position_ids)
            weight = self.lm.get_output_embeddings().weight
            return chunked_cross_entropy(hidden, weight, shift_labels.reshape(hidden.shape[:-1]), self.chunk_tokens)

    return _TrainingModule


def make_training_module(lm, chunk_tokens: int | None = None, flatten_batch: bool = False):
    """Wrap a causal LM so that `module(input_ids, position_ids, shift_labels)` is the summed token loss."""
    from longctx.extend.loss import DEFAULT_CHUNK_TOKENS

    return _training_module_class()(lm, chunk_tokens or DEFAULT_CHUNK_TOKENS, flatten_batch)


def flash_attn_installed() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def flex_attention_available() -> bool:
    """torch's FlexAttention (torch >= 2.5) as transformers' `flex_attention` implementation uses it."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
        from transformers.utils import is_torch_flex_attn_available
    except ImportError:
        return False
    return is_torch_flex_attn_available()


def attention_implementation(choice: str, cuda: bool, cp_size: int) -> tuple[str, str]:
    """(the transformers attn_implementation to train with, why) for `--attention` `choice`.

    Packed sequences need a document mask. flash-attention 2 takes the boundaries from position_ids
    (varlen kernel) and FlexAttention from a BlockMask (transformers masking_utils.flex_attention_mask),
    neither of them dense; SDPA gets a materialised seq_len x seq_len boolean mask per sequence, which also
    rules out its flash kernel. Raises SettingError for a choice that cannot run here.
    """
    def fail(text: str) -> SettingError:
        return SettingError(text, ExtendSettings)

    if cp_size > 1:
        if choice not in ("auto", "sdpa"):
            raise fail(f"{ref('attention')} {choice} does not run with {ref('cp_size')} {cp_size}: torch context "
                       f"parallelism shards SDPA only; use {ref('attention')} sdpa (or auto)")
        return "sdpa", (f"{choice}: torch context parallelism needs SDPA; each sequence is one causal stream, no "
                        "document mask")
    if choice == "flash_attention_2":
        if not cuda:
            raise fail(f"{ref('attention')} flash_attention_2 needs a CUDA GPU; on CPU use {ref('attention')} sdpa "
                       "(or auto)")
        if not flash_attn_installed():
            raise fail(f"{ref('attention')} flash_attention_2: flash_attn is not installed (pip install "
                       f"'longctx[gpu]'); or use {ref('attention')} auto (FlexAttention)")
        return "flash_attention_2", "asked for; documents are separated by position_ids, no dense mask"
    if choice == "flex_attention":
        import torch

        if not flex_attention_available():
            raise fail(f"{ref('attention')} flex_attention: torch {torch.__version__} has no FlexAttention "
                       f"(torch.nn.attention.flex_attention, torch >= 2.5); use {ref('attention')} auto or sdpa")
        if not cuda:
            # torch.nn.attention.flex_attention._validate_device refuses inputs that need gradients on CPU
            raise fail(f"{ref('attention')} flex_attention needs a CUDA GPU: torch {torch.__version__} has no "
                       f"FlexAttention backward on CPU; use {ref('attention')} sdpa (or auto)")
        return "flex_attention", "asked for; FlexAttention masks documents without a dense mask"
    if choice == "sdpa":
        dense = "; a dense seq_len x seq_len document mask is materialised per sequence and layer" if cuda else ""
        return "sdpa", f"asked for{dense}"
    if not cuda:
        return "sdpa", ("auto: on CPU (flash_attn needs CUDA and torch has no FlexAttention backward on CPU); "
                        "documents are masked with a dense mask")
    if flash_attn_installed():
        return "flash_attention_2", "auto: flash_attn is installed; documents are separated by position_ids"
    if flex_attention_available():
        return "flex_attention", "auto: flash_attn is not installed; FlexAttention masks documents without a dense mask"
    return "sdpa", ("auto: neither flash_attn nor FlexAttention (torch >= 2.5) is available; a dense seq_len x "
                    "seq_len document mask is materialised per sequence and layer (pip install 'longctx[gpu]')")


def load_training_model(ckpt: Path, new_cfg: dict[str, Any], attn: str, gradient_checkpointing: bool,
                        trust_remote_code: bool = False):
    """The checkpoint's model with the new RoPE config, in fp32 master weights (bf16 is autocast with one
    process, FSDP2 mixed precision with many), in training mode."""
    lm = load_model(ckpt, dtype="float32", attn_implementation=attn, config=new_cfg,
                    trust_remote_code=trust_remote_code)
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    return lm


def fsdp_plugin(lm):
    from accelerate import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=True,  # full sharding (ZeRO-3)
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=list(lm._no_split_modules or []),  # one FSDP unit per decoder layer
        state_dict_type="SHARDED_STATE_DICT",
        cpu_ram_efficient_loading=False,
        activation_checkpointing=False,  # transformers' own gradient checkpointing is on instead
    )


def make_accelerator(s: ExtendSettings, world_size: int, cuda: bool, plugin):
    """(the Accelerator, the compute dtype name)."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    dtype = s.dtype or ("bfloat16" if cuda else "float32")
    kwargs: dict[str, Any] = {"mixed_precision": "bf16" if dtype == "bfloat16" else "no", "cpu": not cuda}
    if plugin is not None:
        kwargs["fsdp_plugin"] = plugin
    if s.cp_size > 1:
        from accelerate import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(dp_shard_size=world_size // s.cp_size, cp_size=s.cp_size)
    acc = Accelerator(**kwargs)
    if plugin is not None and acc.distributed_type == DistributedType.MULTI_CPU:
        # accelerate applies an FSDP plugin only on accelerators; torch's fully_shard works on gloo CPU
        # ranks as well, so switch the state over the way accelerate itself does on GPUs.
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return acc, dtype
