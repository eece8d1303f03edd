"""A pytest plugin (entry point `pytest11`: `quax`) exposing `quax.testing` as
fixtures, for family test suites:

```python
def test_matmul(quax_testing, my_value, x):
    quax_testing.assert_matches_dense(lambda a, b: a @ b, my_value, x)

@pytest.mark.usefixtures("quax_no_materialisation")
def test_forward(model, x):
    quax.quaxify(model)(x)  # an error if any value was materialised
```
"""

from collections.abc import Iterator
from types import ModuleType

import pytest

from .. import testing
from .._values._value import track_materialisation


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
