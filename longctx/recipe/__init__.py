"""`longctx run RECIPE`: recipes (YAML) whose sections are the verbs' settings, their plan, and the runner
that skips what is done and resumes what was interrupted."""
