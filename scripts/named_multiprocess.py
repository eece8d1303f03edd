"""The named MLP training step on two processes, against one process.

Two processes (`jax.distributed.initialize` on this machine's loopback address, CPU
devices, gloo collectives), each with 4 simulated devices, run one training step of
an MLP on `quax_named.NamedArray`s under one `axis_mapping` (data-parallel over
`batch`, model-parallel over `hidden`) on the global 4 x 2 mesh of their 8 devices.
One process with 8 simulated devices runs the same step. The script checks that
the loss and the updated weights are the same numbers (to float32 rounding: the
gradient's sums over the batch run across the two processes in another order), and
that every input and output has the same sharding, the partition spec its names
ask for; and prints the time taken.

Run on demand (it starts three Python processes: about 45 s on a busy 2-core
machine, too slow for the test suites):

    python scripts/named_multiprocess.py

Nothing leaves the machine: the processes meet on 127.0.0.1.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def step_outputs() -> dict[str, Any]:
    """Run the training step on every device JAX sees (one process, or all the
    processes of a `jax.distributed` run) and return what each process checks."""
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import numpy as np
    import quax
    import quax_named as qn
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType
    from quax_named import NamedArray

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    mapping = {"batch": "data", "hidden": "model"}

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    k = jr.split(jr.PRNGKey(0), 4)
    params = {
        "w1": NamedArray(jr.normal(k[0], (16, 32)) / 4, ("feature", "hidden")),
        "b1": NamedArray(jnp.zeros(32), ("hidden",)),
        "w2": NamedArray(jr.normal(k[1], (32, 8)) / 4, ("hidden", "out")),
    }
    x = NamedArray(jr.normal(k[2], (64, 16)), ("batch", "feature"))
    y = NamedArray(jr.normal(k[3], (64, 8)), ("batch", "out"))

    def step(p: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(quax.quaxify(loss_fn))(p, x, y)
        return loss, qn.shard(jax.tree.map(lambda a, g: a - 0.1 * g, p, grads))

    with qn.axis_mapping(mapping, mesh):
        placed = qn.shard((params, x, y))
        compiled = jax.jit(step).lower(*placed).compile()
        loss, new = compiled(*placed)

    def spec(sharding: Any, ndim: int) -> list[Any]:
        entries = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
        return [list(e) if isinstance(e, tuple) else e for e in entries]

    def gathered(a: Any) -> Any:
        # Every process's shards, assembled on each process.
        return np.asarray(multihost_utils.process_allgather(a, tiled=True))

    return {
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "loss": float(gathered(loss)),
        "weights": {n: gathered(new[n].array).tolist() for n in sorted(new)},
        "input_shardings": {
            "x": spec(placed[1].array.sharding, 2),
            **{
                n: spec(placed[0][n].array.sharding, len(params[n].axes))
                for n in params
            },
        },
        "output_shardings": {
            n: spec(new[n].array.sharding, len(params[n].axes)) for n in sorted(new)
        },
        "compiled_output_shardings": {
            n: spec(compiled.output_shardings[1][n].array, len(params[n].axes))
            for n in sorted(new)
        },
        "asked_for": {
            n: spec(qn.named_sharding(params[n], mesh, mapping), len(params[n].axes))
            for n in sorted(new)
        },
    }


def _child(process_id: int, num_processes: int, port: int) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes,
            process_id=process_id,
        )
    out = step_outputs()
    print("RESULT " + json.dumps(out), flush=True)
    if num_processes > 1:
        jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(process_id: int, num_processes: int, devices: int, port: int) -> Any:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(process_id),
        str(num_processes),
        str(port),
    ]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(process: Any, what: str, timeout: float) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise RuntimeError(f"{what} did not finish in {timeout} s:\n{err}") from None
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed ({process.returncode}):\n{out}\n{err}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(timeout: float = 600.0) -> dict[str, Any]:
    """Run both, compare, and return the comparison with the time taken."""
    import numpy as np

    start = time.perf_counter()
    port = _free_port()
    single = _launch(0, 1, 8, port)
    pair = [_launch(i, 2, 4, port) for i in range(2)]
    one = _result(single, "the single process", timeout)
    two = [_result(p, f"process {i} of 2", timeout) for i, p in enumerate(pair)]
    seconds = time.perf_counter() - start

    # The gradient's sums over the batch run across two processes (gloo) rather
    # than within one: float32 sums in another order, so equal to rounding.
    tolerance = 1e-6
    differences: list[float] = []
    assert one["processes"] == 1 and one["devices"] == 8, one
    for i, result in enumerate(two):
        assert result["processes"] == 2 and result["devices"] == 8, result
        assert result["local_devices"] == 4, result
        # The same numbers, and the same shardings.
        diffs = [abs(result["loss"] - one["loss"])]
        for name, want in one["weights"].items():
            got = np.asarray(result["weights"][name])
            diffs.append(float(np.max(np.abs(got - np.asarray(want)))))
        differences.append(max(diffs))
        assert max(diffs) <= tolerance, (i, diffs)
        for key in (
            "input_shardings",
            "output_shardings",
            "compiled_output_shardings",
        ):
            assert result[key] == one[key], (i, key, result[key], one[key])
        assert result["output_shardings"] == result["asked_for"], result
    return {
        "seconds": seconds,
        "loss": one["loss"],
        "output_shardings": one["output_shardings"],
        "max_abs_difference": max(differences),
        "same_shardings": True,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*map(int, sys.argv[2:5]))
    else:
        parser = argparse.ArgumentParser(
            description="The named MLP training step on two processes, against one."
        )
        parser.add_argument("--timeout", type=float, default=600.0)
        print(json.dumps(main(parser.parse_args().timeout), indent=1))
