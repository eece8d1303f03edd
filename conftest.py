"""Strict settings for every test suite in the repository: tracer-leak checks and
quax's rule-output checks are on, and warnings are errors (see pyproject.toml)."""

import jax
import quax


jax.config.update("jax_check_tracer_leaks", True)
quax.set_debug_checks(True)
