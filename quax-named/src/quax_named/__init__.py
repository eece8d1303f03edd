"""quax-named: arrays with named axes, aligned, contracted and sharded by name in
unmodified JAX code.

```python
import quax, quax_named as qn
x = qn.NamedArray(data, ("batch", "feature"))
w = qn.NamedArray(weight, ("feature", "hidden"))
h = quax.quaxify(lambda x, w: jax.nn.relu(x @ w))(x, w)  # axes (batch, hidden)
```
"""

from . import _rules as _rules  # registers the rules
from ._named import (
    Axis as Axis,
    NamedArray as NamedArray,
    NamedMaterialisationError as NamedMaterialisationError,
)
from ._nmap import nmap as nmap
from ._ops import (
    align as align,
    argmax as argmax,
    argmin as argmin,
    broadcast_to as broadcast_to,
    cumprod as cumprod,
    cumsum as cumsum,
    dot as dot,
    einsum as einsum,
    log_softmax as log_softmax,
    logsumexp as logsumexp,
    max as max,
    mean as mean,
    min as min,
    prod as prod,
    rename as rename,
    softmax as softmax,
    std as std,
    sum as sum,
    trace as trace,
    transpose as transpose,
    var as var,
    where as where,
)
from ._sharding import (
    axis_mapping as axis_mapping,
    named_sharding as named_sharding,
    partition_spec as partition_spec,
    shard as shard,
)
