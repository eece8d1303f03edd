"""Names to a mesh: `PartitionSpec`s and `NamedSharding`s derived from axis names."""

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import quax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._axes import check_name


__all__ = [
    "axis_mapping",
    "constrain",
    "named_sharding",
    "partition_spec",
]

MeshAxes = str | tuple[str, ...] | None


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[dict[str, MeshAxes], Mesh | None]] = []


_state = _State()


def _setting() -> Any:
    """The active mapping and mesh, hashable: rules read them (`constrain`)."""
    if not _state.stack:
        return None
    mapping, mesh = _state.stack[-1]
    return tuple(sorted(mapping.items())), mesh


# Quax reuses what rules traced (compiled eager programs, replayed recordings) only
# under the same setting...
quax.plugins.add_setting(_setting)
# ...and JAX's own caches (a `jax.jit`'s traces, lowerings and compiled programs)
# key on this context: a jitted function traced under one mapping is traced again
# under another, rather than keeping the first one's sharding constraints (made with
# quax's `jit_context`, which changes no `jit`'s key when this family loads inside one).
_jit_context = quax.plugins.jit_context(None)


def _check_mapping(mapping: Any) -> dict[str, MeshAxes]:
    """`mapping` as a dict from axis names to mesh axes (a name, a tuple of names,
    or `None`), else a `ValueError` naming the entry."""
    if not isinstance(mapping, Mapping):
        raise ValueError(
            "`mapping` of `axis_mapping` must be a mapping from axis names to mesh "
            f"axes, got {type(mapping).__name__} {mapping!r}."
        )
    out: dict[str, MeshAxes] = {}
    for name, target in mapping.items():
        check_name(name, "An axis name of `axis_mapping`'s `mapping`")
        if isinstance(target, list):
            target = tuple(target)
        parts = (target,) if isinstance(target, str) else target
        if parts is not None and (
            not isinstance(parts, tuple)
            or not all(isinstance(p, str) and p for p in parts)
        ):
            raise ValueError(
                f"`axis_mapping` maps axis {name!r} to {target!r}: a mesh axis is a "
                "non-empty string, a tuple of them, or `None` (replicated)."
            )
        out[name] = target
    return out


@contextlib.contextmanager
def axis_mapping(
    mapping: Mapping[str, MeshAxes | list[str]], mesh: Mesh | None = None
) -> Iterator[None]:
    """Map axis names to mesh axes while the block runs (also while it is traced).

    Inside the block, every `NamedArray` that a quax_named rule or function creates
    is constrained (`jax.lax.with_sharding_constraint`) to the sharding its names
    ask for, and [`quax_named.shard`][] / [`quax_named.named_sharding`][] use the
    mapping by default.

    ```python
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    with quax_named.axis_mapping({"batch": "data", "hidden": "model"}, mesh):
        params, x = quax_named.shard((params, x))
        loss = jax.jit(quax.quaxify(loss_fn))(params, x)
    ```

    **Arguments:**

    - `mapping`: axis name -> mesh axis name (or a tuple or list of them, or `None`
        for replicated). Names absent from it are replicated.
    - `mesh`: the `jax.sharding.Mesh`; `None` uses the mesh set with
        `jax.sharding.use_mesh`/`jax.set_mesh`.
    """
    _state.stack.append((_check_mapping(mapping), mesh))
    try:
        with _jit_context(_setting()):
            yield
    finally:
        _state.stack.pop()


def _current(
    mapping: Mapping[str, MeshAxes] | None, mesh: Mesh | None
) -> tuple[Mapping[str, MeshAxes] | None, Mesh | None]:
    if mapping is None and _state.stack:
        mapping, outer = _state.stack[-1]
        mesh = mesh if mesh is not None else outer
    return mapping, mesh


def partition_spec(
    axes: Any, mapping: Mapping[str, MeshAxes] | None = None
) -> PartitionSpec:
    """The `PartitionSpec` of an array with `axes` (a `NamedArray`, its `.axes`, or
    names).

    **Arguments:**

    - `axes`: a `NamedArray` (as [`quax_named.named_sharding`][] takes), or its
        axes (`Axis` objects or names), in storage order.
    - `mapping`: axis name -> mesh axes; defaults to the active
        [`quax_named.axis_mapping`][].

    **Returns:**

    One entry per axis: its mesh axes, or `None`.

    **Raises:**

    `TypeError` when an axis is neither a name nor an `Axis`.
    """
    mapping, _ = _current(mapping, None)
    mapping = mapping or {}
    given: Sequence[Any]
    if isinstance(axes, str):  # one name
        given = [axes]
    elif isinstance(axes, quax.Value):  # a NamedArray (whose module imports this)
        named = getattr(axes, "axes", None)
        if named is None:
            raise TypeError(
                f"quax_named.partition_spec needs a NamedArray or its axes (names "
                f"or `Axis` objects), got a {type(axes).__name__}."
            )
        given = named
    else:
        given = axes
    names = []
    for a in given:
        name = a if isinstance(a, str) else getattr(a, "name", ...)
        if name is not None and not isinstance(name, str):
            raise TypeError(
                f"quax_named.partition_spec needs a NamedArray or its axes (names "
                f"or `Axis` objects), got {type(a).__name__} {a!r} among {given!r}."
            )
        names.append(name)
    used: set[str] = set()
    spec = []
    for name in names:
        target = mapping.get(name) if name is not None else None
        parts = (target,) if isinstance(target, str) else (target or ())
        if used & set(parts):
            raise ValueError(
                f"Axis {name!r} maps to mesh axes {target!r}, already used by another "
                f"axis of {tuple(names)}: a mesh axis can shard one array axis only."
            )
        used |= set(parts)
        spec.append(target)
    return PartitionSpec(*spec)


def named_sharding(
    x: Any, mesh: Mesh | None = None, mapping: Mapping[str, MeshAxes] | None = None
) -> NamedSharding:
    """The `NamedSharding` that the names of `x` (a `NamedArray`) ask for.

    **Arguments:**

    - `x`: the `NamedArray`.
    - `mesh`, `mapping`: default to those of the active [`quax_named.axis_mapping`][].

    **Returns:**

    A `jax.sharding.NamedSharding`.
    """
    mapping, mesh = _current(mapping, mesh)
    if mesh is None:
        raise ValueError(
            "named_sharding needs a mesh: pass `mesh=` or use "
            "`quax_named.axis_mapping(mapping, mesh)`."
        )
    return NamedSharding(mesh, partition_spec(x.axes, mapping))


def constrain(array: Any, axes: Sequence[Any]) -> Any:
    """`array` constrained to the sharding of `axes` when an
    [`quax_named.axis_mapping`][] is active; else unchanged."""
    if not _state.stack or quax.is_value(array):
        return array
    mapping, mesh = _state.stack[-1]
    spec = partition_spec(axes, mapping)
    if all(p is None for p in spec):
        return array
    sharding = spec if mesh is None else NamedSharding(mesh, spec)
    return jax.lax.with_sharding_constraint(array, sharding)
