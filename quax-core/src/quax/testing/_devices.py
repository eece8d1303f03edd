"""Running code on several simulated CPU devices, in a subprocess."""

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping


__all__ = ["run_on_simulated_devices"]

_TPU_HUGEPAGES = "Transparent hugepages are not enabled"
_COUNT_FLAG = "--xla_force_host_platform_device_count"


def run_on_simulated_devices(
    source: str,
    n: int = 8,
    *,
    timeout: float = 600,
    warnings_as_errors: bool = True,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run Python `source` in a fresh interpreter that sees `n` simulated CPU devices.

    ```python
    out = quax.testing.run_on_simulated_devices('''
        import jax
        assert len(jax.devices()) == 8
        print("ok")
    ''')
    assert out.strip().endswith("ok")
    ```

    The device count is fixed when JAX starts, so it runs in a subprocess (the same
    Python, `sys.executable`) with `JAX_PLATFORMS=cpu` and
    `XLA_FLAGS=--xla_force_host_platform_device_count=n` (added to any other XLA
    flags of this process); the rest of the environment is inherited, e.g.
    `JAX_CHECK_TRACER_LEAKS`.

    **Arguments:**

    - `source`: the program; it is dedented first. Assert inside it.
    - `n`: the number of devices.
    - `timeout`: seconds before the subprocess is killed (a failure).
    - `warnings_as_errors`: run with `python -W error`, as the test suites do.
    - `env`: extra environment variables for the subprocess.

    **Returns:**

    The subprocess's standard output.

    **Raises:**

    `AssertionError` with the exit status and the tail of its standard output and
    error when it exits with an error or times out.
    """
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if _COUNT_FLAG not in f]
    environ = dict(os.environ)
    environ.update(
        XLA_FLAGS=" ".join([*flags, f"{_COUNT_FLAG}={n}"]), JAX_PLATFORMS="cpu"
    )
    environ.update(env or {})
    # On a Cloud TPU machine, `import jax` warns that transparent hugepages are off
    # (JAX's TPU set-up, which runs before `JAX_PLATFORMS` is read): a setting of that
    # machine, not of the program under test, so it is no error there.
    errors = ["-W", "error", "-W", f"ignore:{_TPU_HUGEPAGES}:UserWarning"]
    command = [sys.executable, *(errors if warnings_as_errors else [])]
    command += ["-c", textwrap.dedent(source)]
    try:
        result = subprocess.run(
            command, env=environ, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"the program on {n} simulated devices ran over {timeout} s:\n"
            f"{_tail(e.stdout)}\n{_tail(e.stderr)}"
        ) from None
    if result.returncode != 0:
        raise AssertionError(
            f"the program on {n} simulated devices exited with status "
            f"{result.returncode}.\n--- stdout ---\n{_tail(result.stdout)}\n"
            f"--- stderr ---\n{_tail(result.stderr)}"
        )
    return result.stdout


def _tail(text: str | bytes | None, limit: int = 4000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-limit:]
