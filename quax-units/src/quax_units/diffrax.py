"""diffrax with times as quantities: `quax_units.diffrax.diffeqsolve`.

```python
import diffrax as dfx
import quax
from quax_units import Quantity
from quax_units.diffrax import diffeqsolve

@quax.quaxify
def solve(t0, t1, dt0, y0, rate):
    term = dfx.ODETerm(lambda t, y, args: -args * y)
    sol = diffeqsolve(term, dfx.Tsit5(), t0, t1, dt0, y0, rate)
    return sol.ts, sol.ys

solve(Quantity(0.0, "s"), Quantity(2.0, "min"), Quantity(1.0, "s"),
      Quantity(1.0, "m"), Quantity(0.1, "1 / s"))  # times in s (t0's unit), y in m
```

diffrax computes with plain times: it divides by `jnp.where(t0 == t1, 1, t1 - t0)`
(`linear_rescale`), a plain 1 beside the times, which no rule can give units
without reading a plain constant in a unit it was not written in. So the solve runs
on the times' numbers in one unit of time (t0's, or `time_unit=`), and the terms'
vector fields see `t` as a quantity in that unit and return their rates times that
unit (the change per plain unit of time, which diffrax multiplies by a plain step).

The module imports diffrax only when `diffeqsolve` is called: quax-units does not
need diffrax, and importing this module without it installed works (the call then
raises an `ImportError` naming the package to install).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.core
import quax

from ._dimensions import UnitError
from ._units import Unit, UnitLike, unit
from ._value import Quantity, ustrip


if TYPE_CHECKING:
    import diffrax


__all__ = ["diffeqsolve"]

_SECOND = unit("s")


def _diffrax() -> Any:
    """The diffrax module, or an `ImportError` saying how to install it."""
    try:
        import diffrax
    except ImportError as e:
        raise ImportError(
            "`quax_units.diffrax.diffeqsolve` runs diffrax, which is not installed: "
            "`pip install diffrax` (or `pip install 'quax-units[diffrax]'`)."
        ) from e
    return diffrax


def _quantity(x: Any) -> Quantity | None:
    """The quantity `x` stands for: `x` itself, or the quantity of a tracer of
    `quax.quaxify` (inside a quaxified function a quantity argument is a tracer,
    whose `quax_value` is the quantity); `None` for a plain number or array."""
    if isinstance(x, Quantity):
        return x
    if isinstance(x, jax.core.Tracer):
        value = getattr(x, "quax_value", None)
        if isinstance(value, Quantity):
            return value
    return None


class _PerTimeUnit(eqx.Module):
    """A vector field for diffrax's plain times in `unit`: it calls `vector_field`
    with `t` as a quantity in `unit`, and returns its rate times one `unit` (the
    change per plain unit of time). Where the state's leaf is plain (`plain`, one
    flag per leaf of the state), that change is a dimensionless quantity (a rate in
    `1 / s` times one second): it is given as its plain numbers, so that the output
    has the state's structure, as diffrax checks (`ustrip` raises a `UnitError`
    where the change is not dimensionless)."""

    vector_field: Callable[..., Any]
    unit: Unit = eqx.field(static=True)
    plain: tuple[bool, ...] = eqx.field(static=True)

    def __call__(self, t: Any, y: Any, args: Any) -> Any:
        rate = self.vector_field(Quantity(t, self.unit), y, args)
        one = Quantity(1.0, self.unit)
        changes, structure = jax.tree.flatten(rate, is_leaf=quax.is_value)
        changes = [c * one for c in changes]
        if len(changes) == len(self.plain):
            changes = [
                self._plain_change(c) if plain else c
                for c, plain in zip(changes, self.plain, strict=True)
            ]
        return jax.tree.unflatten(structure, changes)

    def _plain_change(self, change: Any) -> Any:
        """The plain numbers of the change of a plain leaf of the state."""
        q = _quantity(change)
        if q is not None and not q.units.is_dimensionless:
            raise UnitError(
                "With times as quantities, an `ODETerm`'s vector field returns a "
                "rate (the state's units per unit of time): for a plain leaf of the "
                f"state it returned one whose change over one {self.unit} is in "
                f"{q.unit} ({q.units}), where a plain state needs a dimensionless "
                "change. Return a rate in `1 / s` (`-y * Quantity(0.5, '1 / s')`), "
                "or give the state a unit."
            )
        return ustrip("", change)


class _PerTimeUnitSave(eqx.Module):
    """A `SaveAt` function for diffrax's plain times in `unit`: it calls `fn` with
    `t` as a quantity in `unit`."""

    fn: Callable[..., Any]
    unit: Unit = eqx.field(static=True)

    def __call__(self, t: Any, y: Any, args: Any) -> Any:
        return self.fn(Quantity(t, self.unit), y, args)


class _TimedSolve:
    """The times of one `diffeqsolve` call: which are quantities, which are plain,
    and their numbers in the solve's unit of time."""

    def __init__(self) -> None:
        self.quantities: list[str] = []
        self.plain: list[str] = []
        self.first_unit: Unit | None = None
        self.entries: list[tuple[str, Any]] = []

    def add(self, name: str, x: Any) -> None:
        if x is None:
            return
        q = _quantity(x)
        if q is None:
            self.plain.append(name)
        else:
            self.quantities.append(name)
            if self.first_unit is None:
                self.first_unit = q.unit
        self.entries.append((name, x))

    def check(self, time_unit: UnitLike | None) -> Unit | None:
        """The solve's unit of time, or `None` where every time is plain."""
        if self.quantities and self.plain:
            raise UnitError(
                "`quax_units.diffrax.diffeqsolve` got "
                + ", ".join(f"`{n}`" for n in self.quantities)
                + " as quantities and "
                + ", ".join(f"`{n}`" for n in self.plain)
                + " as plain numbers: give every time as a quantity "
                "(`Quantity(0.0, 's')`), or every time as a plain number (then the "
                "solve is diffrax's own), so that no plain number is read in a unit "
                "it was not given in."
            )
        if not self.quantities:
            if time_unit is not None:
                raise UnitError(
                    "`quax_units.diffrax.diffeqsolve` got `time_unit` with plain "
                    "times: `time_unit` is the unit that times given as quantities "
                    "are converted to; give the times as quantities "
                    "(`Quantity(0.0, 's')`), or leave `time_unit` out."
                )
            return None
        chosen = unit(time_unit) if time_unit is not None else self.first_unit
        assert chosen is not None
        if chosen.dimensions != _SECOND.dimensions or chosen.offset:
            raise UnitError(
                f"`quax_units.diffrax.diffeqsolve` needs a unit of time, got {chosen} "
                f"({chosen.dimensions}) as "
                + ("`time_unit`." if time_unit is not None else "`t0`'s unit.")
            )
        return chosen

    def strip(self, name: str, x: Any, time_unit: Unit) -> Any:
        """The numbers of the time `name` in `time_unit`."""
        if x is None:
            return None
        try:
            return ustrip(time_unit, x)
        except UnitError as e:
            raise UnitError(
                f"`quax_units.diffrax.diffeqsolve`: `{name}` is not a time ({e})"
            ) from None


def _replace(module: Any, **fields: Any) -> Any:
    """`module` with `fields` replaced (fields that hold `None` too)."""
    names = list(fields)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names],
        module,
        [fields[n] for n in names],
        is_leaf=lambda x: x is None,
    )


def _subs(saveat: Any) -> list[Any]:
    """The `SubSaveAt`s of `saveat`, in the order of its `subs` pytree."""
    dfx = _diffrax()
    return jax.tree.leaves(saveat.subs, is_leaf=lambda s: isinstance(s, dfx.SubSaveAt))


def _sub_name(i: int, n: int) -> str:
    """The name of the times of the `i`th of `n` `SubSaveAt`s, for errors."""
    return "saveat.ts" if n == 1 else f"saveat.subs[{i}].ts"


def _controller_times(controller: Any, prefix: str) -> dict[str, Any]:
    """The times a step-size controller holds, by name (`stepsize_controller.dtmin`)."""
    dfx = _diffrax()
    if isinstance(controller, dfx.PIDController):
        return {
            f"{prefix}.dtmin": controller.dtmin,
            f"{prefix}.dtmax": controller.dtmax,
        }
    if isinstance(controller, dfx.ClipStepSizeController):
        return {
            f"{prefix}.step_ts": controller.step_ts,
            f"{prefix}.jump_ts": controller.jump_ts,
            **_controller_times(controller.controller, f"{prefix}.controller"),
        }
    if isinstance(controller, dfx.StepTo):
        return {f"{prefix}.ts": controller.ts}
    return {}


def _strip_controller(controller: Any, prefix: str, stripped: dict[str, Any]) -> Any:
    """`controller` with the times `_controller_times` found replaced by `stripped`."""
    dfx = _diffrax()
    if isinstance(controller, dfx.PIDController):
        return _replace(
            controller,
            dtmin=stripped.get(f"{prefix}.dtmin"),
            dtmax=stripped.get(f"{prefix}.dtmax"),
        )
    if isinstance(controller, dfx.ClipStepSizeController):
        return _replace(
            controller,
            step_ts=stripped.get(f"{prefix}.step_ts"),
            jump_ts=stripped.get(f"{prefix}.jump_ts"),
            controller=_strip_controller(
                controller.controller, f"{prefix}.controller", stripped
            ),
        )
    if isinstance(controller, dfx.StepTo):
        return _replace(controller, ts=stripped.get(f"{prefix}.ts"))
    return controller


def _per_time_unit_terms(terms: Any, time_unit: Unit, y0: Any) -> Any:
    """`terms` with every `ODETerm`'s vector field taking and giving times in
    `time_unit` (`MultiTerm`s term by term), for the state `y0`; other terms are
    refused."""
    dfx = _diffrax()
    plain = tuple(
        _quantity(leaf) is None for leaf in jax.tree.leaves(y0, is_leaf=quax.is_value)
    )

    def convert(term: Any) -> Any:
        if type(term) is dfx.ODETerm:
            return dfx.ODETerm(_PerTimeUnit(term.vector_field, time_unit, plain))
        if type(term) is dfx.MultiTerm:
            return dfx.MultiTerm(*(convert(t) for t in term.terms))
        raise TypeError(
            f"`quax_units.diffrax.diffeqsolve` with times as quantities takes "
            f"`ODETerm`s (and `MultiTerm`s of them), not `{type(term).__name__}`: "
            "the control of a `ControlTerm` is a path that the solver evaluates at "
            "plain times, whose units quax-units cannot know. Solve with plain times "
            "(the times' numbers in one unit, `ustrip('s', t0)`), and give the "
            "vector field a quantity time (`f(t * s, y, args) * s` with "
            "`s = Quantity(1.0, 's')`) and the control increments in that unit."
        )

    return jax.tree.map(
        convert, terms, is_leaf=lambda t: isinstance(t, dfx.AbstractTerm)
    )


def diffeqsolve(
    terms: Any,
    solver: Any,
    t0: Any,
    t1: Any,
    dt0: Any,
    y0: Any,
    args: Any = None,
    *,
    saveat: "diffrax.SaveAt | None" = None,
    stepsize_controller: "diffrax.AbstractStepSizeController | None" = None,
    time_unit: UnitLike | None = None,
    **kwargs: Any,
) -> "diffrax.Solution":
    """`diffrax.diffeqsolve`, with times given as quantities. Call it inside
    `quax.quaxify`, as any diffrax solve on quantities (states, arguments,
    tolerances):

    ```python
    @quax.quaxify
    def solve(t0, t1, dt0, ts, y0, rate, atol):
        return diffeqsolve(
            diffrax.ODETerm(lambda t, y, args: -args * y), diffrax.Tsit5(),
            t0, t1, dt0, y0, rate,
            saveat=diffrax.SaveAt(ts=ts),  # `ts` a quantity of time
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=atol),
        )

    solve(Quantity(0.0, "s"), Quantity(1.0, "min"), Quantity(100.0, "ms"),
                Quantity(jnp.linspace(0.0, 60.0, 5), "s"),
          Quantity(jnp.array([1.0, 2.0]), "m"),
          Quantity(0.5, "1 / s"), Quantity(1e-8, "m"))
    ```

    The times (`t0`, `t1`, `dt0`, the `ts` of the `SaveAt` and of its `subs`, and a
    controller's `dtmin`, `dtmax`, `step_ts`, `jump_ts` (`PIDController`,
    `ClipStepSizeController`) or `ts` (`StepTo`)) are all quantities or all plain.
    Quantities may be in any unit of time: the solve runs on their numbers in one
    unit (`time_unit`, or `t0`'s), and diffrax's steps are those of the same solve
    written with plain numbers in that unit. The vector field of each `ODETerm`
    sees `t` as a quantity in that unit and returns a rate (the state's units per
    unit of time). Plain times run diffrax's own solve, unchanged.

    `SaveAt(ts=...)` converts its times with `jnp.asarray`, which refuses a quantity
    outside `quax.quaxify`: build it inside the quaxified function, or outside as
    `quax.quaxify(diffrax.SaveAt)(ts=ts)` (likewise `ClipStepSizeController` and
    `StepTo`).

    **Arguments:**

    - `terms`, `solver`, `y0`, `args`: as for `diffrax.diffeqsolve`. With times as
        quantities, `terms` holds `ODETerm`s (or `MultiTerm`s of them): other terms
        (`ControlTerm`, ...) are refused, as their controls are paths that diffrax
        evaluates at plain times.
    - `t0`, `t1`, `dt0`: the start, the end and the first step (or `None`, as for
        diffrax): quantities of time, or plain numbers.
    - `saveat`: a `diffrax.SaveAt` (default: diffrax's, `SaveAt(t1=True)`). Its
        `fn`s see `t` as a quantity. Dense output (`dense=True`) is refused with
        times as quantities: its `evaluate` takes plain times.
    - `stepsize_controller`: a step-size controller (default: diffrax's,
        `ConstantStepSize()`).
    - `time_unit`: the unit of time the solve runs in (default: `t0`'s unit); only
        with times as quantities.
    - `**kwargs`: diffrax's other keywords (`adjoint`, `max_steps`, `throw`,
        `progress_meter`, `solver_state`, `controller_state`, `made_jump`, `event`),
        passed on. An `event` is refused with times as quantities (its condition
        would see plain times).

    **Returns:**

    A `diffrax.Solution`. With times as quantities, its `t0`, `t1` and `ts` are
    quantities in the solve's unit of time; `ys` has the state's units either way.
    Its `stats`, `solver_state` and `controller_state` are diffrax's, in plain
    numbers of that unit.

    Raises a [`quax_units.UnitError`][] where some times are quantities and others
    plain numbers, where a time is not a time, or where `time_unit` is given with
    plain times.
    """
    dfx = _diffrax()
    save = dfx.SaveAt(t1=True) if saveat is None else saveat
    controller = (
        dfx.ConstantStepSize() if stepsize_controller is None else stepsize_controller
    )
    times = _TimedSolve()
    times.add("t0", t0)
    times.add("t1", t1)
    times.add("dt0", dt0)
    subs = _subs(save)
    for i, sub in enumerate(subs):
        times.add(_sub_name(i, len(subs)), sub.ts)
    controller_times = _controller_times(controller, "stepsize_controller")
    for name, x in controller_times.items():
        times.add(name, x)
    unit_of_time = times.check(time_unit)
    if unit_of_time is None:
        return dfx.diffeqsolve(
            terms,
            solver,
            t0,
            t1,
            dt0,
            y0,
            args,
            saveat=save,
            stepsize_controller=controller,
            **kwargs,
        )
    if kwargs.get("event") is not None:
        raise TypeError(
            "`quax_units.diffrax.diffeqsolve` with times as quantities does not take "
            "an `event`: its condition function would see diffrax's plain times. "
            "Solve with plain times (`ustrip('s', t0)`, ...) for an event."
        )
    if save.dense:
        raise TypeError(
            "`quax_units.diffrax.diffeqsolve` with times as quantities does not save "
            "dense output (`SaveAt(dense=True)`): the solution's `evaluate` would "
            "take plain times. Save at the times you need (`SaveAt(ts=...)`), or "
            "solve with plain times (`ustrip('s', t0)`, ...)."
        )
    stripped = {name: times.strip(name, x, unit_of_time) for name, x in times.entries}
    new_subs = [
        _replace(
            sub,
            ts=stripped.get(_sub_name(i, len(subs))),
            fn=_PerTimeUnitSave(sub.fn, unit_of_time),
        )
        for i, sub in enumerate(subs)
    ]
    sol = dfx.diffeqsolve(
        _per_time_unit_terms(terms, unit_of_time, y0),
        solver,
        stripped["t0"],
        stripped["t1"],
        stripped.get("dt0"),
        y0,
        args,
        saveat=_replace(
            save,
            subs=jax.tree.unflatten(
                jax.tree.structure(
                    save.subs, is_leaf=lambda s: isinstance(s, dfx.SubSaveAt)
                ),
                new_subs,
            ),
        ),
        stepsize_controller=_strip_controller(
            controller, "stepsize_controller", stripped
        ),
        **kwargs,
    )

    def timed(t: Any) -> Any:
        return Quantity(t, unit_of_time)

    return _replace(
        sol,
        t0=timed(sol.t0),
        t1=timed(sol.t1),
        ts=None if sol.ts is None else jax.tree.map(timed, sol.ts),
    )
