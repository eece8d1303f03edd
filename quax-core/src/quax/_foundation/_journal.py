"""Taking back what a block of code added to quax's tables.

A family adds rules (`quax.register`), settings (`quax.plugins.add_setting`) and
value types (subclasses of `quax.Value`) as its modules are imported. When its
registration raises half-way, the plugin loader takes back everything it added, so
that a family's registration is all or nothing. Each module that adds to one of
quax's tables notes here, with `record`, how to take the addition back;
`all_or_nothing` collects those notes for a block, in the thread that runs it (what
other threads add meanwhile is theirs), and applies them, newest first, when the
block raises.
"""

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator


__all__ = ["Block", "all_or_nothing", "record", "temporarily"]


@dataclasses.dataclass
class Block:
    """What a block of `all_or_nothing` added.

    **Fields:**

    - `take_backs`: how to take back each addition, oldest first.
    - `modules`: the modules that made the additions (a rule's, a setting's or a
        value type's `__module__`).
    """

    take_backs: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    modules: set[str] = dataclasses.field(default_factory=set)


class _Open(threading.local):
    def __init__(self) -> None:
        # The blocks open in this thread, innermost last.
        self.blocks: list[Block] = []


_open = _Open()


def record(take_back: Callable[[], None], module: str | None) -> None:
    """Note how to take back an addition just made to one of quax's tables, if a
    block of `all_or_nothing` is open in this thread (otherwise nothing is kept).

    **Arguments:**

    - `take_back`: undoes the addition.
    - `module`: the module that made it (the rule's or class's `__module__`).

    **Returns:**

    Nothing.
    """
    if _open.blocks:
        block = _open.blocks[-1]
        block.take_backs.append(take_back)
        if module:
            block.modules.add(module)


@contextlib.contextmanager
def all_or_nothing() -> Iterator[Block]:
    """Run a block whose additions to quax's tables are all taken back if it raises
    (any exception, `KeyboardInterrupt` included), newest first. A block that
    succeeds inside another hands its additions to the enclosing one.

    **Returns:**

    A context manager yielding the `Block`, which still lists
    the additions and their modules after the block ends.
    """
    block = Block()
    _open.blocks.append(block)
    try:
        yield block
    except BaseException:
        _open.blocks.pop()
        for take_back in reversed(block.take_backs):
            take_back()
        raise
    _open.blocks.pop()
    if _open.blocks:
        outer = _open.blocks[-1]
        outer.take_backs.extend(block.take_backs)
        outer.modules |= block.modules


@contextlib.contextmanager
def temporarily() -> Iterator[Block]:
    """Run a block whose additions to quax's tables are all taken back when it
    ends, however it ends: for checks that register rules of their own for a while
    (`quax.testing.assert_thread_safe`).

    **Returns:**

    A context manager yielding the `Block`.
    """
    block = Block()
    _open.blocks.append(block)
    try:
        yield block
    finally:
        _open.blocks.pop()
        for take_back in reversed(block.take_backs):
            take_back()
