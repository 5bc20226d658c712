"""The `hf` backend: transformers `generate`, one prompt at a time (greedy), for models vLLM cannot run and for
cross-checks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.load import check_device, load_model, model_config
from longctx.checkpoint.prompt_tokenizer import transformers_tokenizer
from longctx.checkpoint.tokenizer import load_tokenizer
from longctx.core.errors import InputError
from longctx.core.kinds import Text
from longctx.core.settings import setting
from longctx.eval.backends import Backend, BackendContext, BackendOptions, device_info, dtype_setting, run_dtype
from longctx.eval.request import OnResult, Request


@dataclass(frozen=True)
class HfOptions(BackendOptions):
    dtype: str | None = dtype_setting()
    device: str | None = setting(None, Text(), "hf: torch device [default: cuda when available].")

    def check_inputs(self, offline_data: bool = True) -> None:
        # what the machine has, like a file: checked when a recipe loads, not when its ruler stage starts
        check_device(self.device)


class HfBackend(Backend):
    """transformers `generate`, one prompt at a time (greedy)."""

    name = "hf"
    Options = HfOptions
    needs_transformers_model = True

    def __init__(self, checkpoint: str, max_model_len: int, *, dtype: str = "auto", device: str | None = None,
                 seed: int = 0, trust_remote_code: bool = False, tokenizer: Any = None):
        self.checkpoint = checkpoint
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.trust_remote_code = trust_remote_code
        self.model = None
        self.tok = tokenizer
        self._load_failure: InputError | None = None  # what `start` met, raised by `generate`

    @classmethod
    def create(cls, options: HfOptions, context: BackendContext) -> HfBackend:
        return cls(context.checkpoint_dir, context.max_model_len,
                   dtype=run_dtype(options.dtype, context.checkpoint_dir, context.trust_remote_code),
                   device=options.device, seed=context.seed, trust_remote_code=context.trust_remote_code,
                   tokenizer=context.tokenizer)

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, "dtype": self.dtype,
                **({"trust_remote_code": True} if self.trust_remote_code else {})}

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction: the dtype (`run_dtype`) and the device it runs on."""
        import torch

        dtype = run_dtype(self.dtype, self.checkpoint, self.trust_remote_code)
        return {"dtype": dtype, "device": self.device or ("cuda" if torch.cuda.is_available() else "cpu")}

    def close(self) -> None:
        self.model = None  # the weights are freed with the last reference

    def check(self) -> None:
        """Refuse, before anything is generated, a device torch does not have and a config transformers cannot
        build."""
        check_device(self.device)
        model_config(self.checkpoint, trust_remote_code=self.trust_remote_code)

    def _load(self) -> None:
        import torch


        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = (transformers_tokenizer(self.tok) if self.tok is not None else
                    load_tokenizer(self.checkpoint, self.trust_remote_code))
        self.model = load_model(self.checkpoint, dtype=self.dtype, device=device,
                                trust_remote_code=self.trust_remote_code).eval()

    def needs_start(self) -> bool:
        return self.model is None and self._load_failure is None

    def start(self, staging: Path) -> None:
        """Load the model; a failure is raised by `generate`."""
        if self.needs_start():
            try:
                self._load()
            except InputError as e:
                self._load_failure = e

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        import torch

        if self._load_failure is not None:
            failure, self._load_failure = self._load_failure, None
            raise failure
        if self.model is None:
            self._load()
        torch.manual_seed(self.seed)
        device = self.model.device
        self.ran = {"dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                    "device": device_info(device)}
        for r in requests:
            ids = self.tok(r.prompt, return_tensors="pt").input_ids.to(device)
            n = ids.shape[1]
            if n == 0:  # generate() cannot start from nothing
                raise InputError(f"the tokenizer of '{self.checkpoint}' encodes a prompt to no tokens")
            if n + r.max_tokens > self.max_model_len:
                raise InputError(f"a prompt of {n} tokens + {r.max_tokens} to generate exceeds max_model_len "
                                 f"{self.max_model_len}")
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_tokens,
                                          do_sample=False, pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
            on_result(r, self.tok.decode(out[0, n:], skip_special_tokens=True), n)
