"""Test settings for quax-core: make the shared `helpers` module importable.

The tests run with `--import-mode=importlib`, which does not put the test folder on
`sys.path`, so it is added here for `from helpers import ...`.
"""

import pathlib
import sys


sys.path.insert(0, str(pathlib.Path(__file__).parent))
