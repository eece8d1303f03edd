"""The adapter round trip with the real peft, on an equivalent torch model (an
embedding, two `Linear` layers with ReLU, a `Linear` head of 2 outputs, so that
its rank is capped and peft's `rank_pattern`/`alpha_pattern` are exercised).
Driven by `scripts/peft_roundtrip.sh`, in three steps:

1. `write DIR` (quax-lora's environment): for each variant (LoRA, rsLoRA, DoRA),
   a loraified Equinox model with random adapters; its base weights, the tokens,
   its outputs, and the adapter saved with `save_adapter(format="peft")`.
2. `check DIR` (peft's environment, CPU torch): the torch model with those base
   weights, `PeftModel.from_pretrained` of our adapter, its outputs against ours;
   then an adapter made by peft (random `lora_B` and magnitude), saved by
   `save_pretrained`, with torch's outputs.
3. `read DIR` (quax-lora's environment): peft's adapter loaded with
   `load_adapter`, our outputs against torch's.

Each step prints the largest absolute and relative differences; the script exits
non-zero when one exceeds the float32 tolerance.
"""

import json
import pathlib
import sys

import numpy as np


VARIANTS = ("lora", "rslora", "dora")
VOCAB, WIDTH, HIDDEN, OUT, RANK, ALPHA = 50, 16, 32, 2, 4, 8.0
TOLERANCE = 1e-5


def _compare(label: str, got: np.ndarray, want: np.ndarray) -> bool:
    err = float(np.max(np.abs(got - want)))
    rel = err / float(np.max(np.abs(want)))
    ok = rel < TOLERANCE
    print(f"{label}: max |diff| {err:.2e}, relative {rel:.2e} {'ok' if ok else 'FAIL'}")
    return ok


# Steps 1 and 3: JAX -------------------------------------------------------------------


def _eqx_model(variant: str):
    import equinox as eqx
    import jax
    import jax.random as jr
    import quax_lora

    class Net(eqx.Module):
        embed: eqx.nn.Embedding
        layers: list
        head: eqx.nn.Linear

        def __init__(self, key):
            k = jr.split(key, 4)
            self.embed = eqx.nn.Embedding(VOCAB, WIDTH, key=k[0])
            self.layers = [
                eqx.nn.Linear(WIDTH, HIDDEN, key=k[1]),
                eqx.nn.Linear(HIDDEN, WIDTH, key=k[2]),
            ]
            self.head = eqx.nn.Linear(WIDTH, OUT, key=k[3])

        def __call__(self, tokens):
            def one(token):
                x = self.embed(token)
                for layer in self.layers:
                    x = jax.nn.relu(layer(x))
                return self.head(x)

            return jax.vmap(one)(tokens)

    base = Net(jr.key(0))
    # DoRA adapts the Linear layers only (quax-lora has no DoRA embedding).
    layers = eqx.nn.Linear if variant == "dora" else (eqx.nn.Linear, eqx.nn.Embedding)
    lora = quax_lora.loraify(
        base, rank=RANK, alpha=ALPHA, variant=variant, filter=layers, key=jr.key(1)
    )
    return base, lora


def _base_tensors(base) -> dict[str, np.ndarray]:
    out = {"embed.weight": np.asarray(base.embed.weight)}
    for name, layer in [
        ("layers.0", base.layers[0]),
        ("layers.1", base.layers[1]),
        ("head", base.head),
    ]:
        out[f"{name}.weight"] = np.asarray(layer.weight)
        out[f"{name}.bias"] = np.asarray(layer.bias)
    return out


def write(root: pathlib.Path) -> bool:
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import quax
    import quax_lora
    from safetensors.numpy import save_file

    tokens = np.array([0, 3, 17, 49, 3, 25], np.int64)
    for variant in VARIANTS:
        base, lora = _eqx_model(variant)
        counter = iter(range(1000))

        def perturb(x, counter=counter):
            if not quax_lora.is_lora(x):
                return x
            k = jr.fold_in(jr.key(2), next(counter))
            a = x.a + 0.2 * jr.normal(jr.fold_in(k, 0), x.a.shape)
            b = 0.2 * jr.normal(jr.fold_in(k, 1), x.b.shape)
            out = x.replace(a=a, b=b)
            if x.magnitude is not None:
                scale = jr.uniform(jr.fold_in(k, 2), x.magnitude.shape, minval=0.5)
                out = out.replace(magnitude=x.magnitude * (0.5 + scale))
            return out

        tuned = jax.tree.map(perturb, lora, is_leaf=quax_lora.is_lora)
        here = root / variant
        here.mkdir(parents=True, exist_ok=True)
        quax_lora.save_adapter(here / "ours", tuned, format="peft")
        save_file(_base_tensors(base), str(here / "base.safetensors"))
        outputs = quax.quaxify(tuned)(jnp.asarray(tokens))
        save_file(
            {"tokens": tokens, "outputs": np.asarray(outputs)},
            str(here / "ours_outputs.safetensors"),
        )
        print(f"{variant}: wrote our adapter ({here / 'ours'})")
    return True


def read(root: pathlib.Path) -> bool:
    import jax.numpy as jnp
    import quax
    import quax_lora
    from safetensors.numpy import load_file

    ok = True
    for variant in VARIANTS:
        here = root / variant
        _, lora = _eqx_model(variant)
        loaded = quax_lora.load_adapter(here / "peft", lora)
        data = load_file(str(here / "peft_outputs.safetensors"))
        ours = np.asarray(quax.quaxify(loaded)(jnp.asarray(data["tokens"])))
        ok &= _compare(f"{variant}: peft's adapter in quax-lora", ours, data["outputs"])
    return ok


# Step 2: torch and peft ---------------------------------------------------------------


def check(root: pathlib.Path) -> bool:
    # peft's environment (step 2 of the docstring), not the workspace's.
    import peft  # pyright: ignore[reportMissingImports]
    import torch  # pyright: ignore[reportMissingImports]
    from safetensors.numpy import load_file, save_file

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.layers = torch.nn.ModuleList(
                [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)]
            )
            self.head = torch.nn.Linear(WIDTH, OUT)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.head(x)

    print(f"torch {torch.__version__}, peft {peft.__version__}")
    ok = True
    for variant in VARIANTS:
        here = root / variant
        base_tensors = {
            k: torch.from_numpy(v)
            for k, v in load_file(str(here / "base.safetensors")).items()
        }
        data = load_file(str(here / "ours_outputs.safetensors"))
        tokens = torch.from_numpy(data["tokens"])

        def base_model(base_tensors=base_tensors):
            net = Net()
            net.load_state_dict(base_tensors)
            return net.eval()

        config = json.loads((here / "ours" / "adapter_config.json").read_text())
        model = peft.PeftModel.from_pretrained(base_model(), str(here / "ours")).eval()
        with torch.no_grad():
            got = model(tokens).numpy()
        ok &= _compare(f"{variant}: our adapter in peft", got, data["outputs"])

        # The other way: an adapter peft makes and saves.
        targets = ["layers.0", "layers.1", "head"] + (
            [] if variant == "dora" else ["embed"]
        )
        peft_config = peft.LoraConfig(
            r=RANK,
            lora_alpha=ALPHA,
            target_modules=targets,
            rank_pattern=config["rank_pattern"],
            alpha_pattern=config["alpha_pattern"],
            use_rslora=variant == "rslora",
            use_dora=variant == "dora",
        )
        torch.manual_seed(0)
        model = peft.get_peft_model(base_model(), peft_config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.add_(0.2 * torch.randn_like(param))
        with torch.no_grad():
            outputs = model(tokens).numpy()
        model.save_pretrained(str(here / "peft"))
        save_file(
            {"tokens": data["tokens"], "outputs": outputs},
            str(here / "peft_outputs.safetensors"),
        )
        print(f"{variant}: wrote peft's adapter ({here / 'peft'})")
    return ok


if __name__ == "__main__":
    step, root = sys.argv[1], pathlib.Path(sys.argv[2])
    sys.exit(0 if {"write": write, "check": check, "read": read}[step](root) else 1)
