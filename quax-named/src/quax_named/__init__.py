"""quax-named: arrays with named axes, aligned, contracted and sharded by name in
unmodified JAX code.

```python
import quax, quax_named as qn
x = qn.NamedArray(data, ("batch", "feature"))
w = qn.NamedArray(weight, ("feature", "hidden"))
h = quax.quaxify(lambda x, w: jax.nn.relu(x @ w))(x, w)  # axes (batch, hidden)
```
"""

from . import _rules as _rules, fft as fft  # importing _rules registers the rules
from ._axes import Axis as Axis
from ._model import (
    argmax as argmax,
    argmin as argmin,
    argsort as argsort,
    concatenate as concatenate,
    cumprod as cumprod,
    cumsum as cumsum,
    dot as dot,
    einsum as einsum,
    flatten_axes as flatten_axes,
    log_softmax as log_softmax,
    logsumexp as logsumexp,
    max as max,
    mean as mean,
    min as min,
    pad as pad,
    prod as prod,
    rearrange as rearrange,
    roll as roll,
    scan as scan,
    shard as shard,
    softmax as softmax,
    sort as sort,
    split as split,
    stack as stack,
    std as std,
    sum as sum,
    take as take,
    trace as trace,
    unflatten_axis as unflatten_axis,
    var as var,
    where as where,
)
from ._nmap import nmap as nmap
from ._sharding import (
    axis_mapping as axis_mapping,
    named_sharding as named_sharding,
    partition_spec as partition_spec,
)
from ._value import (
    NamedArray as NamedArray,
    NamedMaterialisationError as NamedMaterialisationError,
    align as align,
    broadcast_to as broadcast_to,
    rename as rename,
    transpose as transpose,
)
