"""The clocks the benchmarks time with, chosen for the machine they run on.

On a development machine shared with other jobs, this process's CPU time is less
noisy than the wall clock, and the benchmarks that time host work (tracing, eager
dispatch) or programs compiled for the CPU read it. Two machines break that:

- on an accelerator, a compiled program runs on the device while this process
  waits: its CPU time is not the program's time, and programs are timed on the wall
  clock;
- some sandboxes hardly account CPU time per process: on the TPU machine the
  benchmarks were first run on (2026-12-08), `time.process_time()` and
  `time.thread_time()` read 0 over most calls and traces, so ratios of CPU times
  divided by zero or read 0. There the wall clock stands in.

`host_clock()` is for host work, `program_clock()` for compiled programs; `name`
says which clock a figure was read on.
"""

import functools as ft
import time
from collections.abc import Callable

import jax


def _advances(clock: Callable[[], float]) -> bool:
    """Whether `clock` counts at least half of 50 ms of this thread's work (a busy
    loop): not a clock that stands still, nor one that ticks now and then."""
    start, wall = clock(), time.perf_counter()
    while time.perf_counter() - wall < 0.05:
        pass
    return clock() - start >= 0.025


@ft.cache
def host_clock(per_thread: bool = False) -> Callable[[], float]:
    """The clock for work on the host: this process's CPU time
    (`time.process_time`), or this thread's with `per_thread=True`
    (`time.thread_time`), where the machine accounts it; the wall clock
    (`time.perf_counter`) where it does not."""
    clock = time.thread_time if per_thread else time.process_time
    return clock if _advances(clock) else time.perf_counter


def program_clock() -> Callable[[], float]:
    """The clock for compiled programs: the host clock on the CPU backend, the wall
    clock on an accelerator (whose programs run while this process waits)."""
    if jax.default_backend() == "cpu":
        return host_clock()
    return time.perf_counter


def name(clock: Callable[[], float]) -> str:
    """`"CPU time"` or `"wall-clock time"`, for a benchmark's table."""
    return "wall-clock time" if clock is time.perf_counter else "CPU time"
