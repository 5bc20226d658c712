"""A module as the flag scan reads it (tests/test_flag_names.py): --seq-len in this docstring is documentation."""

from longctx.core.settings import setting

WHAT = setting(None, None, "help", flag="--seq-len")  # a declaration: where the flag lives
MESSAGE = "pass --seq-len 4k"  # spelled by hand: found
LATER = f"or --resume to continue {WHAT}"  # found in an f-string too
OTHER = "vllm serve --max-model-len 4096"  # another tool's flag that longctx does not have: not found
