"""Adapters in peft's layout: a directory with `adapter_model.safetensors` (the
tensors, named `base_model.model.<module>.lora_A.weight` and so on, laid out as
peft's torch layers store them) and `adapter_config.json` (peft's `LoraConfig`).
[`quax_lora.save_adapter`][] and [`quax_lora.load_adapter`][] call it with
`format="peft"`."""

import collections
import io
import json
import math
import pathlib
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from ._value import CorruptAdapterError, LoraArray, LoraWarning, _user_stacklevel


__all__ = [
    "CONFIG_NAME",
    "CONV",
    "EMBEDDING",
    "LINEAR",
    "MixedDropoutWarning",
    "WEIGHTS_NAME",
    "module_name",
    "narrowing_error",
    "narrows",
    "read_json_header",
    "read_peft",
    "refused_dtype",
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


class MixedDropoutWarning(LoraWarning):
    """`save_adapter(format="peft")` of a model whose layers have different LoRA
    dropouts: peft's config holds one `lora_dropout`, so the largest is written,
    and peft trains every layer with it. Dropout changes only training, never a
    loaded adapter's outputs."""


def file_label(f: Any) -> str:
    """How messages name the file `f` (a path, or an open file): its name, or
    that it was passed as a file object without one."""
    name = f if isinstance(f, str | pathlib.Path) else getattr(f, "name", None)
    return f"`{name}`" if isinstance(name, str | pathlib.Path) else "(a file object)"


def corrupt(file: str, field: str, problem: str) -> CorruptAdapterError:
    """The error for an adapter file that cannot be as quax-lora or peft wrote
    it: `file` (as `file_label` names it), its `field`, and what is wrong."""
    return CorruptAdapterError(
        f"quax_lora.load_adapter: the adapter file {file} is corrupt: its {field} "
        f"{problem}. It is not as quax_lora.save_adapter or peft writes a file "
        "(cut short, or changed since): save the adapter again, or load an "
        "intact copy."
    )


def read_json_header(f: BinaryIO, file: str) -> dict[str, Any]:
    """The JSON object that follows in `f` after its length (8 bytes,
    little-endian), as quax-lora's adapter files and safetensors files begin,
    with the length checked against what is left of the file before reading it
    (`f` is seekable)."""
    raw = f.read(8)
    if len(raw) < 8:
        raise corrupt(file, "header length", f"is cut short ({len(raw)} of 8 bytes)")
    length = int.from_bytes(raw, "little")
    position = f.tell()
    left = f.seek(0, io.SEEK_END) - position
    f.seek(position)
    if length > left:
        raise corrupt(
            file,
            "header length",
            f"says {length} bytes, and only {left} byte(s) follow it",
        )
    return _json_object(f.read(length), file, "header")


def _json_object(data: bytes, file: str, field: str) -> dict[str, Any]:
    """The JSON object `data` holds (UTF-8 text), the `field` of `file`; a
    `CorruptAdapterError` naming them when it holds none."""
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise corrupt(file, field, f"is not UTF-8 (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise corrupt(
            file, field, f"is not JSON ({e.msg}, at character {e.pos})"
        ) from e
    if not isinstance(value, dict):
        raise corrupt(file, field, f"is a JSON {_json_kind(value)}, not an object")
    return value


def _json_kind(value: Any) -> str:
    """What JSON calls the type of a value `json.loads` returned."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


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


def _named(name: str) -> str:
    """Our module `name` as messages show it: `` `layers.0` ``, and the model
    itself (a layer that is the whole model: `""`) said so."""
    return f"`{name}`" if name else "`` (the model itself)"


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
    out: dict[str, np.ndarray]
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
        magnitude = np.asarray(lora.magnitude)
        if kind == CONV:  # peft's is (1, out, 1, ...), as the norms it divides
            magnitude = magnitude.reshape((1, -1) + (1,) * (lora.ndim - 2))
        out["lora_magnitude_vector"] = magnitude
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
            problems.append(f"layer {_named(name)}: {problem}")
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
    inits = {(lora.init, lora.init_settings) for _, lora in entries}
    if len(inits) > 1:
        raise ValueError(
            f"quax_lora.save_adapter(format='peft'): the model's layers were "
            f"initialised differently ({sorted(str(i) for i, _ in inits)}), and a "
            "peft config records one init_lora_weights. Loraify every layer with "
            "the same init=, or save in quax-lora's own format."
        )
    # The most common rank and alpha are the config's; the others its patterns.
    rank = collections.Counter(lora.rank for _, lora in entries).most_common(1)[0][0]
    alpha = collections.Counter(
        _alpha_for(lora) for _, lora in entries if lora.rank == rank
    ).most_common(1)[0][0]
    dropouts = {lora.dropout for _, lora in entries}
    if len(dropouts) > 1:
        by_dropout = collections.defaultdict(list)
        for peft, lora in entries:
            by_dropout[lora.dropout].append(_named(peft))
        listed = "; ".join(
            f"{p} for {', '.join(names)}" for p, names in sorted(by_dropout.items())
        )
        warnings.warn(
            f"quax_lora.save_adapter(format='peft'): the layers have different LoRA "
            f"dropouts ({listed}), and peft's config has one lora_dropout: "
            f"{max(dropouts)}, the largest, is written, so peft would train every "
            "layer with it (the adapter's outputs do not depend on it). Loraify "
            "the layers with one dropout= for a config that says how each was "
            "trained, or save in quax-lora's own format (format='quax'), where "
            "each layer keeps the dropout of the model it is loaded into.",
            MixedDropoutWarning,
            stacklevel=_user_stacklevel(),
        )
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
        **_init_config(entries[0][1]),
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
    }
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def _pattern(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    """The value of peft's `rank_pattern` / `alpha_pattern` for module `name`, as
    peft's `get_pattern_key` reads them: the first key, in the config's order, that
    (as a regular expression) matches the end of `name` at a dot; else a key equal
    to `name`; else `default`. (A key equal to `name` is not preferred to an
    earlier key matching its end: `{"0": 2, "layers.0": 4}` gives `layers.0`
    rank 2, in peft and here.)"""
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?({key})", name):
            return value
    return patterns.get(name, default)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _are(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """`check` of a value, or of each value of a list (a JSON array)."""
    return lambda x: check(x) or (isinstance(x, list) and all(map(check, x)))


def _values_are(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """`check` of each value of a dict (a JSON object)."""
    return lambda x: isinstance(x, dict) and all(map(check, x.values()))


# The JSON types of the keys `read_peft` reads, as peft's `LoraConfig` writes
# them, and how a message says them. A value of another type (`use_dora: "false"`,
# a true string) is a corrupt file, not a setting. `null` stands for peft's
# default, except for `r` and `lora_alpha`, which every peft config holds.
_KEY_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "peft_type": (lambda x: isinstance(x, str), "a string"),
    "r": (lambda x: _is_int(x) and x > 0, "a positive integer"),
    "lora_alpha": (_is_number, "a number"),
    "rank_pattern": (
        _values_are(lambda x: _is_int(x) and x > 0),
        "an object of positive integers",
    ),
    "alpha_pattern": (_values_are(_is_number), "an object of numbers"),
    "use_rslora": (lambda x: isinstance(x, bool), "true or false"),
    "use_dora": (lambda x: isinstance(x, bool), "true or false"),
    "fan_in_fan_out": (lambda x: isinstance(x, bool), "true or false"),
    "target_modules": (_are(lambda x: isinstance(x, str)), "a string or strings"),
    "exclude_modules": (_are(lambda x: isinstance(x, str)), "a string or strings"),
    "layers_pattern": (_are(lambda x: isinstance(x, str)), "a string or strings"),
    "modules_to_save": (
        lambda x: isinstance(x, list) and all(isinstance(v, str) for v in x),
        "an array of strings",
    ),
    "layers_to_transform": (_are(_is_int), "an integer or integers"),
    "bias": (lambda x: isinstance(x, str), "a string"),
    "init_lora_weights": (
        lambda x: isinstance(x, bool | str),
        "true, false or a string",
    ),
    "loftq_config": (
        lambda x: (
            isinstance(x, dict)
            and all(_is_int(x.get(k, 1)) for k in ("loftq_bits", "loftq_iter"))
        ),
        "an object of integers",
    ),
}
_REQUIRED_KEYS = ("r", "lora_alpha")


def _read_config(path: pathlib.Path) -> dict[str, Any]:
    """peft's `adapter_config.json` at `path`: a JSON object whose keys that
    `read_peft` reads have the types peft writes (`_KEY_TYPES`); a
    `CorruptAdapterError` naming the key otherwise."""
    file = file_label(path)
    config = _json_object(path.read_bytes(), file, "text")
    for key in _REQUIRED_KEYS:
        if key not in config:
            raise corrupt(
                file, f"`{key}`", "is missing (peft writes it in every config)"
            )
    for key, (check, kind) in _KEY_TYPES.items():
        value = config.get(key)
        if (value is not None or key in _REQUIRED_KEYS) and not check(value):
            raise corrupt(
                file,
                f"`{key}`",
                f"is {json.dumps(value)}, a JSON {_json_kind(value)}, where peft "
                f"writes {kind}",
            )
    return config


# What `read_peft` does with each key of peft's `LoraConfig` (`adapter_config.json`).
# Read, and checked against the model and the tensors: these.
_READ_KEYS = frozenset(
    {
        "peft_type",
        "r",
        "lora_alpha",
        "rank_pattern",
        "alpha_pattern",
        "use_rslora",
        "use_dora",
        "fan_in_fan_out",
        "target_modules",
        "exclude_modules",
        "layers_to_transform",
        "layers_pattern",
        "modules_to_save",
        "bias",
        "init_lora_weights",
        "loftq_config",
    }
)
# Keys that do not change what a loaded adapter computes: metadata, settings of
# training (`lora_dropout` drops inputs only in training; quax-lora's dropout is
# the model's, on only with a dropout key), of where peft runs, and of the
# initialisations (`init_lora_weights` says which one ran, and is checked).
_INERT_KEYS = frozenset(
    {
        "task_type",
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "auto_mapping",
        "peft_version",
        "lora_dropout",
        "runtime_config",
        "megatron_core",
        "qalora_group_size",
        "eva_config",
        "corda_config",
        "lora_ga_config",
        "ensure_weight_tying",
    }
)
# Keys that, set, make peft compute something quax-lora does not: refused.
_UNSUPPORTED_KEYS = {
    "layer_replication": "repeats layers of the base model, each copy with its "
    "own adapter",
    "alora_invocation_tokens": "makes it an Activated LoRA, applied only from its "
    "invocation tokens on",
    "use_qalora": "makes it a QA-LoRA, whose adapter reads a pooled input",
    "target_parameters": "adapts parameters (torch's nn.Parameter) rather than layers",
    "trainable_token_indices": "trains rows of the embeddings besides the adapter",
    "lora_bias": "gives lora_B a bias",
    "megatron_config": "adapts Megatron's parallel layers",
    "velora_config": "makes it a VeLoRA, a variant quax-lora does not implement",
    "monteclora_config": "makes it a MonteCLoRA, a variant quax-lora does not "
    "implement",
    "use_bdlora": "makes it a BD-LoRA, a variant quax-lora does not implement",
    "arrow_config": "routes between adapters (Arrow), which quax-lora does not "
    "implement",
    "kasa_config": "makes it a KaSA, a variant quax-lora does not implement",
}
_KNOWN_KEYS = _READ_KEYS | _INERT_KEYS | _UNSUPPORTED_KEYS.keys()
# `init_lora_weights` values after which the adapter applies to the base weights
# as they were: `b = 0` (True, "gaussian", "eva") or `a` and `b` drawn
# (False, "orthogonal"), the base untouched.
_PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal")
# Those after which it applies only to base weights peft changed: PiSSA, OLoRA,
# CorDA and LoRA-GA subtract the initial adapter from them, LoftQ quantises them.
# `loraify(init=...)` changes them alike for PiSSA, OLoRA and LoftQ (see
# `_init_of`); CorDA and LoRA-GA need calibration data, and are refused.
_REFUSED_BASE_INITS = ("corda", "lora_ga")
_PISSA_NITER = re.compile(r"pissa_niter_(\d+)")
# peft's LoftQ quantiser for each `loftq_bits`: bitsandbytes' NF4 or int8.
_PEFT_LOFTQ_QUANTISER = {4: "nf4", 8: "int"}
# peft's names of a layer's tensors, after its module's name.
_TENSOR = re.compile(
    r"(?P<module>.*)\.(?P<key>lora_(?:A|B)\.(?:weight|bias)|lora_embedding_[AB]"
    r"|lora_magnitude_vector)"
)


def _neutral(value: Any) -> bool:
    """Whether a config value leaves peft's default behaviour: unset, false or
    empty (a dict of such values too)."""
    if isinstance(value, dict):
        return all(_neutral(v) for v in value.values())
    return value is None or value is False or value in ("", [], {})


def _init_of(config: Mapping[str, Any]) -> str | None:
    """The `loraify(init=...)` that changes the base weights as the config's
    `init_lora_weights` says peft changed them (`"pissa"`,
    `"pissa_niter_<k>"`, `"olora"`, `"loftq"`), or `None` for a config whose
    adapter applies to the unchanged base. Read as peft reads it: `"olora"`
    whatever its case."""
    init = config.get("init_lora_weights", True)
    if not isinstance(init, str):
        return None
    if init in ("pissa", "loftq") or _PISSA_NITER.fullmatch(init):
        return init
    return "olora" if init.lower() == "olora" else None


def _init_config(lora: LoraArray) -> dict[str, Any]:
    """What peft's config records of the initialisation of `lora`:
    `init_lora_weights` (`True` for `b = 0`, or the name of the one that changed
    the base) and `loftq_config` (LoftQ's `loftq_bits` and `loftq_iter`; empty
    otherwise, as peft writes it)."""
    settings = dict(lora.init_settings)
    loftq = (
        {"loftq_bits": settings["bits"], "loftq_iter": settings["iters"]}
        if lora.init == "loftq"
        else {}
    )
    return {
        "init_lora_weights": True if lora.init is None else lora.init,
        "loftq_config": loftq,
    }


def _init_problem(config: Mapping[str, Any], name: str, lora: LoraArray) -> str | None:
    """Why the adapter of peft's `config` does not apply to layer `name`'s base
    weight (`lora.w`, changed or not by `lora.init`), or `None`."""
    init = _init_of(config)
    if init != lora.init:
        said = config.get("init_lora_weights", True)
        return (
            f"layer {_named(name)} was loraified with init={lora.init!r}, and the "
            f"adapter's init_lora_weights={said!r}"
            + (
                " changes the base weights: the adapter applies to the base peft "
                "changed"
                if init is not None
                else " leaves the base weights unchanged: the adapter applies to "
                "the base before any change"
            )
            + f". Loraify the model with init={init!r} (the same rank= and alpha=)"
        )
    if init != "loftq":
        return None
    ours = dict(lora.init_settings)
    theirs = config.get("loftq_config") or {}
    bits, iters = theirs.get("loftq_bits", 4), theirs.get("loftq_iter", 1)
    quantiser = ours["quantiser"]
    if (ours["bits"], ours["iters"]) != (bits, iters) or quantiser not in (
        _PEFT_LOFTQ_QUANTISER.get(bits),
        "custom",
    ):
        return (
            f"layer {_named(name)} was LoftQ-initialised with loftq_bits="
            f"{ours['bits']}, loftq_iters={ours['iters']} and the {quantiser!r} "
            f"quantiser, and the adapter's loftq_config has loftq_bits={bits} "
            f"and loftq_iter={iters} (peft quantises {bits} bits to "
            f"{_PEFT_LOFTQ_QUANTISER.get(bits, 'nothing it knows')!r}): the "
            "quantised base differs. Loraify the model with those settings"
        )
    return None


def _config_problems(config: Mapping[str, Any]) -> list[str]:
    """The settings of peft's `config` that quax-lora cannot reproduce."""
    problems = []
    for key, value in config.items():
        if key in _UNSUPPORTED_KEYS and not _neutral(value):
            problems.append(f"{key}={value!r}, which {_UNSUPPORTED_KEYS[key]}")
        elif key not in _KNOWN_KEYS and not _neutral(value):
            problems.append(
                f"{key}={value!r}, a setting this quax-lora does not know, so it "
                "cannot tell whether peft's outputs depend on it (remove it from "
                "the config if they do not)"
            )
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_REFUSED_BASE_INITS):
        problems.append(
            f"init_lora_weights={init!r}, an initialisation that changes the base "
            "weights from data quax-lora does not have (CorDA's and LoRA-GA's "
            "calibration), so the adapter applies to peft's changed base, not to "
            "this model's. Have peft convert it into an adapter for the unchanged "
            "base (save_pretrained's path_initial_model_for_weight_conversion)"
        )
    elif init not in _PLAIN_INITS and _init_of(config) is None:
        problems.append(
            f"init_lora_weights={init!r}, an initialisation this quax-lora does "
            "not know (it reads True, False, 'gaussian', 'eva' and 'orthogonal', "
            "which leave the base weights unchanged, and 'pissa', "
            "'pissa_niter_<k>', 'olora' and 'loftq', which change them as "
            "loraify(init=...) does)"
        )
    if config.get("bias", "none") not in ("none", "all", "lora_only"):
        problems.append(f"bias={config['bias']!r}, none of peft's values")
    return problems


def _selects(config: Mapping[str, Any], module: str) -> bool:
    """Whether peft, with `config`, puts a LoRA layer at `module`, as its
    `check_target_module_exists` decides: matched by `target_modules` (a regular
    expression matching the whole name, or a list of names matching it or its
    end at a dot), not by `exclude_modules` or `modules_to_save`, and in one of
    `layers_to_transform` (the index after `layers_pattern`, or after the first
    name followed by a number). Without `target_modules` (peft fills it in from
    the model's type), or with `"all-linear"`, any module."""
    exclude = config.get("exclude_modules")
    if isinstance(exclude, str):
        if re.fullmatch(exclude, module):
            return False
    elif exclude and any(module == e or module.endswith(f".{e}") for e in exclude):
        return False
    for saved in config.get("modules_to_save") or ():
        if re.match(rf"(^|.*\.){saved}($|\..*)", module):
            return False
    targets = config.get("target_modules")
    if targets is None or targets == "all-linear":
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    if module in targets:
        return True
    if not any(module.endswith(f".{t}") for t in targets):
        return False
    indices = config.get("layers_to_transform")
    if indices is None or indices == []:
        return True
    patterns = config.get("layers_pattern") or None
    if patterns is None:
        found = re.match(r".*?\.[^.]*\.(\d+)\.", module)
    else:
        found = None
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            found = re.match(rf".*?\.{pattern}\.(\d+)\.", module)
            if found is not None:
                break
    if found is None:
        return False
    index = int(found.group(1))
    return index == indices if isinstance(indices, int) else index in indices


def refused_dtype(stored: Any, adapter: Any) -> str | None:
    """Why a tensor of dtype `stored` in a file cannot be loaded into an adapter of
    dtype `adapter` at all (not even with `cast=True`), or `None`."""
    stored, adapter = jnp.dtype(stored), jnp.dtype(adapter)
    if not jnp.issubdtype(stored, jnp.inexact):
        return f"is of dtype {stored}, where an adapter is floating"
    if jnp.issubdtype(stored, jnp.complexfloating) and not jnp.issubdtype(
        adapter, jnp.complexfloating
    ):
        return (
            f"is complex ({stored}), and the model's adapter real ({adapter}): a "
            "cast would drop the imaginary parts"
        )
    return None


def narrows(stored: Any, adapter: Any) -> bool:
    """Whether converting a tensor of dtype `stored` to dtype `adapter` may round
    it: `adapter` does not hold every value of `stored` (float32 into bfloat16,
    float16 into bfloat16, float64 into float32). The same dtype, or a narrower
    one of the same kind (bfloat16 or float16 into float32), converts exactly."""
    stored, adapter = jnp.dtype(stored), jnp.dtype(adapter)
    return stored != adapter and jnp.promote_types(stored, adapter) != adapter


def narrowing_error(
    narrowed: Mapping[str, tuple[Any, list[tuple[str, Any]]]],
) -> ValueError:
    """The error for adapter tensors stored in dtypes that the model's adapter
    cannot hold exactly: `narrowed` maps each layer (as the message names it) to
    its adapter's dtype and the (name, dtype) of each such tensor."""
    problems, stored = [], set()
    for layer, (adapter, tensors) in narrowed.items():
        dtypes = sorted({str(dtype) for _, dtype in tensors})
        stored.update(dtypes)
        problems.append(
            f"{layer}: the file's {', '.join(f'`{name}`' for name, _ in tensors)} "
            f"{'is' if len(tensors) == 1 else 'are'} {' and '.join(dtypes)}, and "
            f"the model's adapter is {adapter}"
        )
    dtype = stored.pop() if len(stored) == 1 else "<the file's dtype>"
    return ValueError(
        "quax_lora.load_adapter: the file's adapter is stored in a dtype that the "
        "model's adapter does not hold exactly, so loading it would round it: "
        + summarise(problems)
        + f". Loraify the model with the file's adapter dtype, loraify(..., "
        f"adapter_dtype=jnp.{dtype}) (peft's default, autocast_adapter_dtype=True, "
        "keeps a float32 adapter on a bfloat16 or float16 base), or pass cast=True "
        "to load_adapter to round the adapter to the model's dtype knowingly."
    )


def read_peft(
    directory: str | pathlib.Path,
    layers: list[tuple[str, LoraArray, str]],
    *,
    name_map: NameMap,
    fan_in_fan_out: bool | None,
    cast: bool,
) -> list[dict[str, Any]]:
    """The new leaves (`a`, `b`, and DoRA's `magnitude`) of each of `layers`, read
    from the peft adapter in `directory`, after checking that every setting of
    its config is one quax-lora reproduces, that the config's rank, scaling and
    variant are the model's, that every tensor is read, and that the tensors'
    shapes and dtypes fit the model's adapters (a dtype that would round them
    only with `cast`). `fan_in_fan_out=None` is `False` (`(out, in)` weights, as
    `eqx.nn.Linear`'s), refusing a config that says otherwise."""
    directory = pathlib.Path(directory)
    config = _read_config(directory / CONFIG_NAME)
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"quax_lora.load_adapter: {CONFIG_NAME} is for peft_type="
            f"{config.get('peft_type')!r}; only LoRA adapters (peft_type 'LORA', "
            "with rsLoRA and DoRA) can be loaded."
        )
    use_rslora = bool(config.get("use_rslora", False))
    use_dora = bool(config.get("use_dora", False))
    unsupported = _config_problems(config)
    if use_rslora and use_dora:
        unsupported.append(
            "use_rslora=true and use_dora=true, which quax-lora's variants do not "
            "combine"
        )
    if unsupported:
        raise ValueError(
            f"quax_lora.load_adapter: the peft adapter's {CONFIG_NAME} sets what "
            "quax-lora does not reproduce: "
            + summarise(unsupported)
            + ". quax-lora loads LoRA, rsLoRA and DoRA adapters, of unchanged base "
            "weights or of bases changed by PiSSA, OLoRA or LoftQ (into a model "
            "loraified with the same init=); anything else would compute other "
            "outputs than peft's."
        )
    linear = [name for name, _, kind in layers if kind == LINEAR]
    if fan_in_fan_out is None:
        if config.get("fan_in_fan_out") and linear:
            raise ValueError(
                f"quax_lora.load_adapter: the peft adapter's {CONFIG_NAME} has "
                "fan_in_fan_out=true: the torch model it was made for stores its "
                "weights (in, out), as GPT-2's Conv1D. peft's tensors are the same "
                "either way; what decides how they load is how this model stores "
                "the weights of its linear layers ("
                + ", ".join(map(_named, linear[:4]))
                + (", ..." if len(linear) > 4 else "")
                + "). Pass fan_in_fan_out=False "
                "if they are (out, in), as eqx.nn.Linear's, or fan_in_fan_out=True "
                "if (in, out), used as x @ w (a square weight loads either way, "
                "so this is not guessed)."
            )
        fan_in_fan_out = False
    tensors = _read_tensors(directory / WEIGHTS_NAME)
    variant = "rslora" if use_rslora else "dora" if use_dora else "lora"
    found = {key: _TENSOR.fullmatch(key.removeprefix(_PREFIX)) for key in tensors}
    modules = {
        match["module"]
        for key, match in found.items()
        if key.startswith(_PREFIX) and match is not None
    }
    problems: list[str] = []
    narrowed: dict[str, tuple[Any, list[tuple[str, Any]]]] = {}
    read: set[str] = set()
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
        if not _selects(config, peft):
            problems.append(
                f"the file has an adapter for `{peft}`, a module its config's "
                "target_modules (with exclude_modules, modules_to_save, "
                "layers_to_transform and layers_pattern) does not select, so peft "
                "would not load it"
            )
        rank = int(_pattern(config.get("rank_pattern") or {}, peft, config["r"]))
        alpha = float(
            _pattern(config.get("alpha_pattern") or {}, peft, config["lora_alpha"])
        )
        scaling = alpha / (math.sqrt(rank) if use_rslora else rank)
        if lora.variant != variant:
            problems.append(
                f"layer {_named(name)} is loraified with variant={lora.variant!r}, "
                f"and the adapter is {variant!r} (use_rslora={use_rslora}, "
                f"use_dora={use_dora})"
            )
        if lora.rank != rank or not math.isclose(lora.scaling, scaling, rel_tol=1e-9):
            problems.append(
                f"layer {_named(name)} has rank {lora.rank} and scaling "
                f"{lora.scaling!r}, and the adapter's module `{peft}` rank {rank} "
                f"and scaling {scaling!r} (lora_alpha={alpha!r})"
            )
        init_problem = _init_problem(config, name, lora)
        if init_problem is not None:
            problems.append(init_problem)
        problem = _refuse_layout(lora, kind, fan_in_fan_out)
        if problem is not None:
            problems.append(f"layer {_named(name)}: {problem}")
            continue
        want = _tensors(lora, kind, fan_in_fan_out)
        read.update(f"{_PREFIX}{peft}.{key}" for key in want)
        got = {}
        for key, like in want.items():
            stored = tensors.get(f"{_PREFIX}{peft}.{key}")
            if stored is None or stored.shape != like.shape:
                problems.append(
                    f"the adapter's `{_PREFIX}{peft}.{key}` is "
                    + (
                        "missing"
                        if stored is None
                        else f"of shape {stored.shape}, where layer "
                        f"{_named(name)} needs {like.shape}"
                    )
                )
                continue
            refused = refused_dtype(stored.dtype, lora.adapter_dtype)
            if refused is not None:
                problems.append(f"the adapter's `{_PREFIX}{peft}.{key}` {refused}")
                continue
            got[key] = stored
        if len(got) != len(want):
            continue
        wider = [
            (key, x.dtype)
            for key, x in sorted(got.items())
            if narrows(x.dtype, lora.adapter_dtype)
        ]
        if wider and not cast:
            layer = f"layer {_named(name)} (peft module `{peft}`)"
            narrowed[layer] = (lora.adapter_dtype, wider)
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
            "rank=, alpha=, variant= and adapter_dtype=), and map its module names "
            "with name_map=."
        )
    unread = sorted(set(tensors) - read)
    if unread:
        why = []
        if config.get("bias", "none") != "none":
            why.append(f"bias={config['bias']!r}: peft trained biases and saved them")
        if config.get("modules_to_save"):
            why.append(
                f"modules_to_save={config['modules_to_save']!r}: peft trained "
                "whole modules and saved them"
            )
        raise ValueError(
            f"quax_lora.load_adapter: the peft adapter holds tensors that it would "
            f"leave unread: {summarise([f'`{key}`' for key in unread])}"
            + (f" ({'; '.join(why)})" if why else "")
            + ". load_adapter loads the LoRA factors (and DoRA's magnitudes) only, "
            "and without these the outputs would not be peft's. Load them into the "
            "model yourself (safetensors.numpy.load_file), then load the adapter "
            "from a copy of the directory without them."
        )
    if narrowed:
        raise narrowing_error(narrowed)
    return out


def _read_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of the safetensors file at `path`: its header's length, text
    and JSON, and that each tensor's bytes lie in the file, checked here (against
    the file's size, before reading them); the rest (dtypes, shapes against
    lengths) by safetensors; each failure a `CorruptAdapterError` naming the file
    and, where one is to blame, the tensor."""
    file = file_label(path)
    with open(path, "rb") as f:
        header = read_json_header(f, file)
        start = f.tell()
        data = f.seek(0, io.SEEK_END) - start
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if name == "__metadata__" or not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(map(_is_int, offsets))
        ):
            continue  # safetensors says what is wrong with it
        if not 0 <= offsets[0] <= offsets[1] <= data:
            raise corrupt(
                file,
                f"tensor `{name}`",
                f"lies at bytes {offsets[0]} to {offsets[1]} of the data, which "
                f"holds {data} byte(s)",
            )
    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise corrupt(file, "tensors", f"cannot be read by safetensors ({e})") from e


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
