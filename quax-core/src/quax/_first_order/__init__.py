"""The first-order rules layer: quax's own rules for first-order primitives on every
value, whatever its family: primitives that act on every leaf alike (`_leafwise`), and
JAX's newer array primitives run as the ones they replaced (`_decompositions`). They
need the registry and `quaxify`, and no higher-order rule."""
