"""`python -m longctx ...`: what `torchrun -m longctx extend ...` and `accelerate launch -m longctx ...` run."""

from longctx.cli.main import main

if __name__ == "__main__":  # a spawned worker (tokenization) imports this module without running the CLI
    main()
