"""The transform layer: the quax trace and its `process_primitive` (`_trace`), the
jaxpr interpreter that binds a staged body's equations on it (`_interpreter`), and
`quax.quaxify`, the entry point (`_quaxify`)."""
