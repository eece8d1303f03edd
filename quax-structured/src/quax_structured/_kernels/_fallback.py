"""A checked fast answer or its fallback (`checked_or_fallback`): a `lax.cond`
whose fallback branch, on the CPU backend, is one custom call into NumPy code on
the host (`Fallback.on_host`), so that the main program carries none of the
fallback's loops and stays asynchronous; and `in_graph_fallbacks`, which keeps
the fallback in the program (for `jax.export`, which cannot serialise the
custom call)."""

import contextlib
import ctypes
import dataclasses
import functools as ft
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import quax
from jax import lax
from jaxtyping import Array


__all__ = ["Fallback", "checked_or_fallback", "in_graph_fallbacks"]


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
    semiseparable LU, sequential loops) runs on the host, in NumPy, through a
    custom call: the untaken branch of the main program then holds one custom
    call rather than the fallback's loops, which XLA's CPU runtime sets up on
    every call even where the branch is not taken (about 0.4 µs per loop).
    `jax.export` cannot serialise that custom call (it raises `ValueError:
    Cannot serialize code with custom calls whose targets have no
    compatibility guarantees`; an export for GPU or TPU alone holds none):
    trace a function to export inside this block:

    ```python
    with quax_structured.in_graph_fallbacks():
        exported = jax.export.export(jax.jit(quax.quaxify(jnp.linalg.solve)))(a, b)
    ```

    The answers agree, up to rounding, wherever the fallback in the program
    answers; the host's LU pivots within blocks of rows and also answers some
    matrices for which the program's gives NaN (see `_lowrank_host`). A
    function that `jax.jit` compiled outside the block is traced again inside
    it.

    **Returns:**

    A context manager.
    """
    with _in_graph(True):
        yield


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A checked route's fallback, twice: `in_graph(fast, *operands)` in JAX (run
    in the program: off the CPU backend, inside `in_graph_fallbacks()`, and for
    derivatives) and `on_host(fast_leaf, *leaves)` in NumPy (run by the host on
    the CPU backend), on the leaves of `(fast, *operands)` in `jax.tree.leaves`
    order, returning an array of `fast`'s shape and dtype. The host function
    must never run a JAX computation (see `_lowrank_host`), must not raise
    (where it does, the answer is NaN: XLA's legacy custom calls have no way
    to report an error that jaxlib exposes) and must answer wherever
    `in_graph` does, as accurately (it may answer where `in_graph` gives NaN).

    Made once, at module level: creating it registers it by `name` (the
    qualified name of `in_graph`), which the compiled program's custom call
    carries; a program read back from JAX's persistent compilation cache
    finds its fallback by that name, never by an object of this process."""

    in_graph: Callable[..., Array]
    on_host: Callable[..., np.ndarray]

    def __post_init__(self):
        if self.name in _FALLBACKS:
            raise ValueError(f"A fallback named {self.name!r} is already registered.")
        _FALLBACKS[self.name] = self

    @property
    def name(self) -> str:
        return f"{self.in_graph.__module__}.{self.in_graph.__qualname__}"


_FALLBACKS: dict[str, Fallback] = {}


def checked_or_fallback(
    accurate: Array, fast: Array, fallback: Fallback, *operands: Any
) -> Array:
    """`fast` where `accurate` (a boolean scalar, decided once for a `vmap`
    batch: see `for_the_batch`), else `fallback.in_graph(fast, *operands)`, as
    `lax.cond(accurate, lambda fast, *operands: fast, fallback.in_graph, fast,
    *operands)`.

    On the CPU backend (`lax.platform_dependent`) the fallback branch is one
    custom call (`jax.ffi.ffi_call` of a legacy target registered here) whose
    host side runs `fallback.on_host` on the operands' buffers. Unlike
    `jax.pure_callback`, which makes JAX run the whole program synchronously
    (so that a callback may call JAX again), the program stays asynchronous,
    as one without a fallback: that was 0.2x to 0.6x of a hand-written
    Woodbury solve at n = 256. On other backends the fallback stays in the
    program, as it does inside `in_graph_fallbacks()`.

    Under `vmap` the custom call runs once per system (`vmap_method=
    "sequential"`: a loop over the batch in the branch, so each system gets its
    own answer). Derivatives (a `jax.custom_jvp`) are those of `in_graph`:
    the custom call has none."""
    if _in_graph.value:
        return lax.cond(accurate, _keep, fallback.in_graph, fast, *operands)
    return lax.cond(accurate, _keep, ft.partial(_by_backend, fallback), fast, *operands)


def _keep(fast: Array, *operands: Any) -> Array:
    del operands
    return fast


def _by_backend(fallback: Fallback, *args: Any) -> Array:
    """`fallback.in_graph(*args)`: on the CPU backend through the host, elsewhere
    in the program (only the platform's branch is lowered)."""
    leaves, treedef = jax.tree.flatten(args)
    program = _Program(fallback, treedef)
    return lax.platform_dependent(
        *leaves, cpu=ft.partial(_hosted, program), default=program.in_graph
    )


@dataclasses.dataclass(frozen=True)
class _Program:
    """A fallback as a function of its operands' leaves, in the program
    (`in_graph`). Static (hashable, compared by value), no arrays."""

    fallback: Fallback
    treedef: Any

    def in_graph(self, *leaves: Array) -> Array:
        return self.fallback.in_graph(*jax.tree.unflatten(self.treedef, leaves))


@ft.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _hosted(program: _Program, *leaves: Array) -> Array:
    """`program.in_graph(*leaves)`, computed by the host (`Fallback.on_host`,
    through the custom call `_TARGET`); its first leaf is the fast answer, of
    the result's shape and dtype. The custom call carries, as its opaque
    configuration, the fallback's name and each leaf's shape and dtype (JSON):
    all the host reads besides the buffers."""
    spec = {
        "fallback": program.fallback.name,
        "leaves": [[list(np.shape(y)), np.dtype(y.dtype).name] for y in leaves],
    }
    call = jax.ffi.ffi_call(
        _TARGET,
        jax.ShapeDtypeStruct(np.shape(leaves[0]), leaves[0].dtype),
        custom_call_api_version=_API_VERSION,
        legacy_backend_config=json.dumps(spec, separators=(",", ":")),
        vmap_method="sequential",
    )
    return call(*leaves)


@_hosted.defjvp
def _(
    program: _Program, primals: tuple[Array, ...], tangents: tuple[Array, ...]
) -> tuple[Array, Array]:
    return jax.jvp(program.in_graph, primals, tangents)


# The custom call's host side ------------------------------------------------------


_TARGET = "quax_structured_host_fallback"
# XLA's `API_VERSION_STATUS_RETURNING_UNIFIED`: on the CPU backend the target is
# called as `void(void* out, const void** in, const char* opaque, size_t
# opaque_len, XlaCustomCallStatus* status)`.
_API_VERSION = 3


def _view(address: int, shape: list[int], dtype: np.dtype) -> np.ndarray:
    """The row-major buffer at `address` as an array (no copy)."""
    if math.prod(shape) == 0:
        return np.empty(shape, dtype)
    size = math.prod(shape) * dtype.itemsize
    buffer = (ctypes.c_byte * size).from_address(address)
    return np.ctypeslib.as_array(buffer).view(dtype).reshape(shape)


def _run(out: int, ins: Any, opaque: int, opaque_len: int, status: int) -> None:
    """The target: read the configuration, view the buffers, run the
    fallback's `on_host` and write its answer into the output buffer; NaN
    there if anything raised (a ctypes callback cannot raise into XLA)."""
    del status
    spec = json.loads(ctypes.string_at(opaque, opaque_len))
    shapes = [(shape, np.dtype(dtype)) for shape, dtype in spec["leaves"]]
    result = _view(out, *shapes[0])
    try:
        fallback = _FALLBACKS[spec["fallback"]]
        leaves = [_view(ins[i], *shape) for i, shape in enumerate(shapes)]
        result[...] = fallback.on_host(*leaves)
    except Exception:
        # Any failure: NaN, never an unwritten buffer (garbage) or an exception
        # that ctypes would print and drop.
        result[...] = np.nan


_SIGNATURE = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
)
# Kept alive for the life of the process: XLA holds only its address.
_CALLBACK = _SIGNATURE(_run)


def _register() -> None:
    """Register `_CALLBACK` as the CPU custom call target `_TARGET`: a PyCapsule
    of its address named as XLA expects of a legacy target."""
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    address = ctypes.cast(_CALLBACK, ctypes.c_void_p).value
    capsule = capsule_new(address, b"xla._CUSTOM_CALL_TARGET", None)
    jax.ffi.register_ffi_target(_TARGET, capsule, platform="cpu", api_version=0)


_register()
