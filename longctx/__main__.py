"""`python -m longctx ...`: what `torchrun -m longctx extend ...` and `accelerate launch -m longctx ...` run."""

from longctx.cli.main import main

main()
