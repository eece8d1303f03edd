"""The transform layer: the quax trace and its `process_primitive` (`_trace`), and
`quax.quaxify`, the entry point (`_quaxify`)."""
