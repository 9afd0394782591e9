"""What the lessons' ranks run, one module per parallelism, above every parallelism and the trainer:
each `<what>_step` or `<what>_train` runs on the ranks of a pool, beside the one-process
`<what>_reference` it must equal (child processes import them here, never from a notebook cell)."""
