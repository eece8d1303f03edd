"""A pytest plugin (entry point `pytest11`: `quax`) exposing `quax.testing` as
fixtures, for family test suites:

```python
def test_matmul(quax_testing, my_value, x):
    quax_testing.assert_matches_dense(lambda a, b: a @ b, my_value, x)

@pytest.mark.usefixtures("quax_no_materialisation")
def test_forward(model, x):
    quax.quaxify(model)(x)  # an error if any value was materialised

@pytest.mark.float64
def test_solve_in_double_precision(): ...  # skipped on a TPU, with the reason
```
"""

from collections.abc import Iterator
from types import ModuleType

import pytest

from .. import testing
from .._values._value import track_materialisation


# Backends whose hardware has no float64 arithmetic: XLA emulates it there, and its
# emulation lacks operations (on a TPU v5e, `shift-right-arithmetic` of a float64's
# bits fails to compile with INVALID_ARGUMENT).
_NO_NATIVE_FLOAT64 = {"tpu"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "float64: the test's subject is float64 (or complex128) arithmetic; skipped "
        "on a backend with no native float64 (a TPU)",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On a backend with no native float64 (a TPU), the tests marked `float64` skip,
    saying so."""
    marked = [item for item in items if item.get_closest_marker("float64")]
    if not marked:
        return
    import jax

    backend = jax.default_backend()
    if backend not in _NO_NATIVE_FLOAT64:
        return
    skip = pytest.mark.skip(
        reason=f"float64 is this test's subject, and the {backend} backend has no "
        "native float64 (XLA's emulation of it lacks operations)"
    )
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def quax_testing() -> ModuleType:
    """The conformance kit, `quax.testing`."""
    return testing


@pytest.fixture
def quax_no_materialisation() -> Iterator[None]:
    """An error (at the test's teardown, with the report) if a quax value was
    materialised while the test ran, as `quax.track_materialisation` sees it:
    trace inside the test, not in a program compiled before it."""
    with track_materialisation() as report:
        yield
    if report:
        pytest.fail(f"the test materialised quax values:\n{report}", pytrace=False)
