"""The shared bottom layer: errors, units, atomic files, hashing, timestamps and the settings machinery.

Nothing here imports another part of longctx (or torch, transformers, click): every other package,
`ruler_tasks` included, may import it.
"""
