"""The tests of quax-core: a package, so that they share `helpers` by a relative
import (`from .helpers import Dense`)."""
