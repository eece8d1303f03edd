"""A checked fast answer or its fallback (`checked_or_fallback`): a `lax.cond`
whose fallback branch, on the CPU backend, runs as a separately compiled program
reached through a host callback, so that the main program carries none of the
fallback's loops; and `in_graph_fallbacks`, which keeps the fallback in the
program (for `jax.export`, which cannot serialise a host callback)."""

import contextlib
import dataclasses
import functools as ft
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import quax
from jax import lax
from jaxtyping import Array


__all__ = ["checked_or_fallback", "in_graph_fallbacks"]


# A `jax.jit`-cache-sensitive setting (quax's caches key on it too): a function
# traced under `in_graph_fallbacks()` is traced again outside it, and the other
# way round, rather than keeping the other route.
_in_graph = quax.plugins.jit_context(False)


@contextlib.contextmanager
def in_graph_fallbacks() -> Iterator[None]:
    """Keep the fallbacks of the checked solves and determinants inside the
    compiled program while the block runs (also while it is traced).

    On the CPU backend, where a structure's fast route (Woodbury for
    `LowRankPlusDiagonal`) fails its accuracy check, its fallback (the
    semiseparable LU, sequential loops) runs as a program of its own, reached
    through a host callback (`jax.pure_callback`): the untaken branch of the
    main program then holds one callback rather than the fallback's loops,
    which XLA's CPU runtime sets up on every call even where the branch is
    not taken (about 0.4 µs per loop). `jax.export` cannot serialise a host
    callback for the CPU platform (it raises `NotImplementedError:
    serialization of host_callbacks is not yet implemented`, and for several
    platforms at once `multi-platform lowering for python_callback`; an export
    for GPU or TPU alone holds no callback): trace a function to export inside
    this block:

    ```python
    with quax_structured.in_graph_fallbacks():
        exported = jax.export.export(jax.jit(quax.quaxify(jnp.linalg.solve)))(a, b)
    ```

    The answers are the same either way. A function that `jax.jit` compiled
    outside the block is traced again inside it.

    **Returns:**

    A context manager.
    """
    with _in_graph(True):
        yield


def checked_or_fallback(
    accurate: Array, fast: Array, fallback: Callable[..., Array], *operands: Any
) -> Array:
    """`fast` where `accurate` (a boolean scalar, decided once for a `vmap`
    batch: see `for_the_batch`), else `fallback(fast, *operands)`, as
    `lax.cond(accurate, lambda fast, *operands: fast, fallback, fast, *operands)`.

    On the CPU backend (`lax.platform_dependent`) the fallback runs as its own
    compiled program through `jax.pure_callback`, one per `fallback`, operand
    structure and shapes (`jax.jit` of it, cached here: no tracing again per
    call or per trace). On other backends it stays in the program, as it does
    inside `in_graph_fallbacks()`: a host round trip there would cost more than
    the branch, and calling JAX from a callback may deadlock on a GPU.

    Under `vmap` the host runs the fallback vmapped over the batch (the leading
    axes of the operands, several for nested `vmap`s, flattened into one), so
    each system gets its own answer. Derivatives (a `jax.custom_jvp`) are those
    of the fallback run in the program: `pure_callback` has none.

    `fallback`: a function of module level (its identity keys the compiled
    programs; a closure made per trace would compile again per trace), of
    `fast` and `operands` (pytrees of arrays, value types included), returning
    an array of `fast`'s shape and dtype."""
    if _in_graph.value:
        return lax.cond(accurate, _keep, fallback, fast, *operands)
    return lax.cond(accurate, _keep, ft.partial(_by_backend, fallback), fast, *operands)


def _keep(fast: Array, *operands: Any) -> Array:
    del operands
    return fast


def _by_backend(fallback: Callable[..., Array], *args: Any) -> Array:
    """`fallback(*args)`: on the CPU backend through the host, elsewhere in the
    program (only the platform's branch is lowered)."""
    leaves, treedef = jax.tree.flatten(args)
    shapes = tuple(np.shape(leaf) for leaf in leaves)
    program = _Program(fallback, treedef, shapes, bool(jax.enable_x64.value))
    return lax.platform_dependent(
        *leaves,
        cpu=ft.partial(_hosted, program),
        default=program.in_graph,
    )


@dataclasses.dataclass(frozen=True)
class _Program:
    """A fallback as a function of its operands' leaves: the host callback
    (`__call__`, on NumPy arrays) and the same computation in the program
    (`in_graph`). Static (hashable, compared by value), no arrays."""

    fallback: Callable[..., Array]
    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    # Whether the trace ran with 64-bit types: the callback runs in another
    # thread, which does not see a `jax.enable_x64` block of the caller's.
    x64: bool

    def in_graph(self, *leaves: Array) -> Array:
        return self.fallback(*jax.tree.unflatten(self.treedef, leaves))

    def __call__(self, *leaves: np.ndarray) -> np.ndarray:
        """The fallback's answer for operands with `batch` leading axes (`vmap`,
        `vmap_method="expand_dims"`: an unbatched operand has axes of size 1
        there), computed as one batch by a compiled `jax.vmap` of it."""
        batch_axes = np.ndim(leaves[0]) - len(self.shapes[0])
        with jax.enable_x64(self.x64):
            if batch_axes == 0:
                out = _compiled(self.fallback, self.treedef, None)(*leaves)
                return np.asarray(out)
            batch = np.broadcast_shapes(*(np.shape(y)[:batch_axes] for y in leaves))
            size = math.prod(batch)
            args, in_axes = [], []
            for leaf, shape in zip(leaves, self.shapes, strict=True):
                if size != 1 and all(d == 1 for d in np.shape(leaf)[:batch_axes]):
                    args.append(np.reshape(leaf, shape))
                    in_axes.append(None)
                else:
                    stacked = np.broadcast_to(leaf, batch + shape)
                    args.append(np.reshape(stacked, (size, *shape)))
                    in_axes.append(0)
            compiled = _compiled(self.fallback, self.treedef, tuple(in_axes))
            out = np.asarray(compiled(*args))
            return np.reshape(out, batch + out.shape[1:])


@ft.lru_cache(maxsize=256)
def _compiled(
    fallback: Callable[..., Array], treedef: Any, in_axes: tuple[int | None, ...] | None
) -> Callable[..., Array]:
    """`jax.jit` of `fallback` on its operands' leaves (`vmap`ped over `in_axes`
    unless `None`), one per static structure; `jax.jit` keeps one compiled
    program per shape and dtype."""

    def run(*leaves: Array) -> Array:
        return fallback(*jax.tree.unflatten(treedef, leaves))

    return jax.jit(run if in_axes is None else jax.vmap(run, in_axes=in_axes))


@ft.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _hosted(program: _Program, *leaves: Array) -> Array:
    """`program.in_graph(*leaves)`, computed by the host (`pure_callback`); its
    first leaf is the fast answer, of the result's shape and dtype."""
    out = jax.ShapeDtypeStruct(np.shape(leaves[0]), leaves[0].dtype)
    return jax.pure_callback(program, out, *leaves, vmap_method="expand_dims")


@_hosted.defjvp
def _(
    program: _Program, primals: tuple[Array, ...], tangents: tuple[Array, ...]
) -> tuple[Array, Array]:
    return jax.jvp(program.in_graph, primals, tangents)
