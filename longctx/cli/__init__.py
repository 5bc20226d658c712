"""The `longctx` command line (`longctx.cli.main:main`): one click command per verb, derived from the verb's
settings type (`longctx.cli.options`), each calling one library function and printing its result."""
