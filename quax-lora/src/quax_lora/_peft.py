"""Adapters in peft's layout: a directory with `adapter_model.safetensors` (the
tensors, named `base_model.model.<module>.lora_A.weight` and so on, laid out as
peft's torch layers store them) and `adapter_config.json` (peft's `LoraConfig`).
[`quax_lora.save_adapter`][] and [`quax_lora.load_adapter`][] call it with
`format="peft"`."""

import collections
import json
import math
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from ._value import LoraArray


__all__ = [
    "CONFIG_NAME",
    "CONV",
    "EMBEDDING",
    "LINEAR",
    "WEIGHTS_NAME",
    "module_name",
    "read_peft",
    "summarise",
    "write_peft",
]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# How many differences a refusal to load names (a model of many layers loraified
# with another alpha differs at every layer).
_PROBLEMS_SHOWN = 4

NameMap = Mapping[str, str] | Callable[[str], str] | None


def module_name(path: str) -> str:
    """The dotted module name peft uses for the layer whose weight is at `path`
    (as `jax.tree_util.keystr` writes it): `.layers[0].weight` is `layers.0`, and
    a layer that is the model itself (`.weight`) is `""`."""
    name = re.sub(r"\[(?:'([^']*)'|\"([^\"]*)\"|([^\]]*))\]", r".\1\2\3", path)
    return name.removesuffix(".weight").lstrip(".")


def summarise(problems: list[str]) -> str:
    """The first few of `problems`, joined, and how many more there are."""
    if len(problems) > _PROBLEMS_SHOWN:
        hidden = len(problems) - _PROBLEMS_SHOWN
        problems = [*problems[:_PROBLEMS_SHOWN], f"and {hidden} more difference(s)"]
    return "; ".join(problems)


def _peft_name(name: str, name_map: NameMap) -> str:
    if name_map is None:
        return name
    if callable(name_map):
        return name_map(name)
    return name_map.get(name, name)


def _alpha_for(lora: LoraArray) -> float:
    """peft's `lora_alpha` giving this layer's scaling: `s * rank` (rsLoRA:
    `s * sqrt(rank)`)."""
    root = math.sqrt(lora.rank) if lora.variant == "rslora" else lora.rank
    return lora.scaling * root


# What a layer is to peft, which decides how its tensors are laid out: a
# `Linear` (or GPT-2's `Conv1D`, with `fan_in_fan_out`), an `Embedding`, or a
# convolution.
LINEAR, EMBEDDING, CONV = "linear", "embedding", "conv"


def _refuse_layout(lora: LoraArray, kind: str, fan_in_fan_out: bool) -> str | None:
    if lora.adapters is not None:
        return (
            f"it stacks {lora.adapters} adapters (take one out with "
            "quax_lora.unstack_adapters)"
        )
    if lora.batch_ndim != 0:
        return (
            f"it adapts a stack of {lora.shape[: lora.batch_ndim]} matrices "
            "(batch_ndim > 0), which peft has no layer for"
        )
    if kind == CONV and lora.row_ndim == 1 and fan_in_fan_out:
        return "a convolution kernel (out, in, *k) has no fan_in_fan_out layout"
    if lora.variant == "dora" and fan_in_fan_out:
        return "DoRA normalises the outputs, the columns of a fan_in_fan_out weight"
    return None


def _tensors(lora: LoraArray, kind: str, fan_in_fan_out: bool) -> dict[str, np.ndarray]:
    """The tensors of one layer under peft's names (after the module's name):
    `lora_A` maps the input to the rank, `lora_B` the rank to the output, as
    torch weights `(out, in)`."""
    a, b = np.asarray(lora.a), np.asarray(lora.b)
    if kind == EMBEDDING:  # (vocab, d) = (n, m): a[i] b
        out = {"lora_embedding_A": a.T, "lora_embedding_B": b.T}
    elif kind == CONV and lora.row_ndim > 1:
        # An NNX kernel (*k, in, out): a is a kernel (*k, in, rank), torch's
        # (rank, in, *k); b (rank, out) a 1x1 one, torch's (out, rank, 1, ...).
        k = lora.ndim - 2
        out = {
            "lora_A.weight": np.transpose(a, (k + 1, k, *range(k))),
            "lora_B.weight": b.T.reshape(b.T.shape + (1,) * k),
        }
    elif kind == CONV:  # a kernel (out, in, *k): b is a kernel, a a 1x1 one
        out = {
            "lora_A.weight": b,
            "lora_B.weight": a.reshape(a.shape + (1,) * (lora.ndim - 2)),
        }
    else:
        # A matrix, its rows and columns flattened (an `nnx.LinearGeneral`
        # kernel (in, heads, head_dim) is torch's Linear of in x heads * head_dim).
        a, b = a.reshape(-1, lora.rank), b.reshape(lora.rank, -1)
        if fan_in_fan_out:  # w is (in, out): the input meets a first
            out = {"lora_A.weight": a.T, "lora_B.weight": b.T}
        else:  # w is (out, in), as torch's Linear
            out = {"lora_A.weight": b, "lora_B.weight": a}
    if lora.magnitude is not None:
        out["lora_magnitude_vector"] = np.asarray(lora.magnitude)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_peft(
    directory: str | pathlib.Path,
    layers: list[tuple[str, LoraArray, str]],
    *,
    name_map: NameMap,
    fan_in_fan_out: bool,
) -> None:
    """Write `layers` (our module name, the array, what it is to peft: `LINEAR`,
    `EMBEDDING` or `CONV`) to `directory` in peft's layout."""
    if not layers:
        raise ValueError("quax_lora.save_adapter: the model has no LoraArray.")
    problems, tensors = [], {}
    entries = []
    for name, lora, kind in layers:
        peft = _peft_name(name, name_map)
        problem = _refuse_layout(lora, kind, fan_in_fan_out)
        if problem is not None:
            problems.append(f"layer `{name}`: {problem}")
            continue
        for key, value in _tensors(lora, kind, fan_in_fan_out).items():
            tensors[f"{_PREFIX}{peft}.{key}"] = value
        entries.append((peft, lora))
    if problems:
        raise ValueError(
            "quax_lora.save_adapter(format='peft') cannot write "
            + "; ".join(problems)
            + ". Adapt only those layers peft can (loraify's filter= and where=), "
            "or save in quax-lora's own format (format='quax')."
        )
    variants = {lora.variant for _, lora in entries}
    if len(variants) > 1:
        raise ValueError(
            f"quax_lora.save_adapter(format='peft'): the model mixes the variants "
            f"{sorted(variants)}, and a peft config has one. Loraify every layer "
            "with the same variant=, or save in quax-lora's own format."
        )
    variant = variants.pop()
    # The most common rank and alpha are the config's; the others its patterns.
    rank = collections.Counter(lora.rank for _, lora in entries).most_common(1)[0][0]
    alpha = collections.Counter(
        _alpha_for(lora) for _, lora in entries if lora.rank == rank
    ).most_common(1)[0][0]
    dropouts = {lora.dropout for _, lora in entries}
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": None,
        "revision": None,
        "inference_mode": True,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": max(dropouts),
        "target_modules": sorted(peft for peft, _ in entries),
        "rank_pattern": {
            peft: lora.rank for peft, lora in entries if lora.rank != rank
        },
        "alpha_pattern": {
            peft: _alpha_for(lora)
            for peft, lora in entries
            if not math.isclose(_alpha_for(lora), alpha, rel_tol=1e-12)
        },
        "use_rslora": variant == "rslora",
        "use_dora": variant == "dora",
        "fan_in_fan_out": fan_in_fan_out,
        "bias": "none",
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
    }
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def _pattern(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    """The value of peft's `rank_pattern` / `alpha_pattern` for module `name`: a
    key equal to it, else the first key (a regular expression) that matches its
    end at a dot, as peft reads them; else `default`."""
    if name in patterns:
        return patterns[name]
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?{key}", name):
            return value
    return default


def read_peft(
    directory: str | pathlib.Path,
    layers: list[tuple[str, LoraArray, str]],
    *,
    name_map: NameMap,
    fan_in_fan_out: bool | None,
) -> list[dict[str, Any]]:
    """The new leaves (`a`, `b`, and DoRA's `magnitude`) of each of `layers`, read
    from the peft adapter in `directory`, after checking that the config's rank,
    scaling and variant are the model's."""
    directory = pathlib.Path(directory)
    config = json.loads((directory / CONFIG_NAME).read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"quax_lora.load_adapter: {CONFIG_NAME} is for peft_type="
            f"{config.get('peft_type')!r}; only LoRA adapters (peft_type 'LORA', "
            "with rsLoRA and DoRA) can be loaded."
        )
    tensors = load_file(str(directory / WEIGHTS_NAME))
    if fan_in_fan_out is None:
        fan_in_fan_out = bool(config.get("fan_in_fan_out", False))
    use_rslora = bool(config.get("use_rslora", False))
    use_dora = bool(config.get("use_dora", False))
    if use_rslora and use_dora:
        raise ValueError(
            "quax_lora.load_adapter: the peft adapter uses rsLoRA and DoRA together, "
            "which quax-lora's variants do not combine."
        )
    variant = "rslora" if use_rslora else "dora" if use_dora else "lora"
    modules = {
        key.removeprefix(_PREFIX).rsplit(".lora_", 1)[0]
        for key in tensors
        if key.startswith(_PREFIX) and ".lora_" in key
    }
    problems: list[str] = []
    out = []
    seen = set()
    for name, lora, kind in layers:
        peft = _peft_name(name, name_map)
        seen.add(peft)
        if peft not in modules:
            problems.append(
                f"the model adapts `{name}` (peft module `{peft}`), for which the "
                "file has no adapter"
            )
            continue
        rank = int(_pattern(config.get("rank_pattern") or {}, peft, config["r"]))
        alpha = float(
            _pattern(config.get("alpha_pattern") or {}, peft, config["lora_alpha"])
        )
        scaling = alpha / (math.sqrt(rank) if use_rslora else rank)
        if lora.variant != variant:
            problems.append(
                f"layer `{name}` is loraified with variant={lora.variant!r}, and the "
                f"adapter is {variant!r} (use_rslora={use_rslora}, "
                f"use_dora={use_dora})"
            )
        if lora.rank != rank or not math.isclose(lora.scaling, scaling, rel_tol=1e-9):
            problems.append(
                f"layer `{name}` has rank {lora.rank} and scaling {lora.scaling!r}, "
                f"and the adapter's module `{peft}` rank {rank} and scaling "
                f"{scaling!r} (lora_alpha={alpha!r})"
            )
        problem = _refuse_layout(lora, kind, fan_in_fan_out)
        if problem is not None:
            problems.append(f"layer `{name}`: {problem}")
            continue
        want = _tensors(lora, kind, fan_in_fan_out)
        got = {}
        for key, like in want.items():
            stored = tensors.get(f"{_PREFIX}{peft}.{key}")
            if stored is None or stored.shape != like.shape:
                problems.append(
                    f"the adapter's `{_PREFIX}{peft}.{key}` is "
                    + (
                        "missing"
                        if stored is None
                        else f"of shape {stored.shape}, where layer `{name}` needs "
                        f"{like.shape}"
                    )
                )
                continue
            got[key] = stored
        if len(got) != len(want):
            continue
        out.append(_leaves(lora, kind, fan_in_fan_out, got))
    extra = sorted(modules - seen)
    if extra:
        problems.append(
            f"the file has adapters for {', '.join(f'`{p}`' for p in extra)}, which "
            "the model does not adapt (pass name_map= if its modules are named "
            "otherwise)"
        )
    if problems:
        raise ValueError(
            "quax_lora.load_adapter: the peft adapter does not fit the model: "
            + summarise(problems)
            + ". Loraify the model as the adapter was made (the same modules, "
            "rank=, alpha= and variant=), and map its module names with name_map="
        )
    return out


def _leaves(
    lora: LoraArray, kind: str, fan_in_fan_out: bool, got: dict[str, Any]
) -> dict[str, Any]:
    def like(x: Any, ref: Any) -> Any:
        return jnp.asarray(x, dtype=ref.dtype).reshape(ref.shape)

    if kind == EMBEDDING:
        a, b = got["lora_embedding_A"].T, got["lora_embedding_B"].T
    elif kind == CONV and lora.row_ndim > 1:
        k = lora.ndim - 2
        a = np.transpose(got["lora_A.weight"], (*range(2, k + 2), 1, 0))
        b = got["lora_B.weight"].reshape(lora.b.shape[::-1]).T
    elif kind == CONV:
        a, b = got["lora_B.weight"], got["lora_A.weight"]
    elif fan_in_fan_out:
        a, b = got["lora_A.weight"].T, got["lora_B.weight"].T
    else:
        a, b = got["lora_B.weight"], got["lora_A.weight"]
    leaves = {"a": like(a, lora.a), "b": like(b, lora.b)}
    if lora.magnitude is not None:
        leaves["magnitude"] = like(got["lora_magnitude_vector"], lora.magnitude)
    return leaves
