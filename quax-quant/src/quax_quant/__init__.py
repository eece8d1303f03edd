"""quax-quant: quantised arrays for quax: int8, int4, NF4 (with double
quantisation) and float8 weights in unmodified Equinox models,
quantisation-aware training, and QLoRA with quax-lora.

```python
import quax, quax_quant
qmodel = quax_quant.quantise_model(model, bits=4, group_size=64)
y = quax.quaxify(qmodel)(x)
```
"""

from . import _rules as _rules  # registers the rules
from ._awq import awq as awq, awq_quantise as awq_quantise, awq_scales as awq_scales
from ._checkpoint import (
    AWQ_ORDER as AWQ_ORDER,
    describe as describe,
    from_gptq as from_gptq,
    load_quantised as load_quantised,
    save_quantised as save_quantised,
    to_gptq as to_gptq,
)
from ._gptq_algorithm import gptq as gptq, quantise_columns as quantise_columns
from ._kernels import (
    NF4_CODE as NF4_CODE,
    pack_int4 as pack_int4,
    unpack_int4 as unpack_int4,
)
from ._matmul import (
    BLOCK_ELEMENTS as BLOCK_ELEMENTS,
    DEFAULT_KERNELS as DEFAULT_KERNELS,
    KERNELS_VARIABLE as KERNELS_VARIABLE,
    REDUCE_MAX_ROWS as REDUCE_MAX_ROWS,
    WEIGHT_ONLY_MAX_ROWS as WEIGHT_ONLY_MAX_ROWS,
    Kernels as Kernels,
    kernel_choices as kernel_choices,
    kernels as kernels,
    matmul_path as matmul_path,
)
from ._model import (
    MemoryReport as MemoryReport,
    calibrate as calibrate,
    is_quantised as is_quantised,
    memory_report as memory_report,
    quantise_model as quantise_model,
)
from ._quantise import quantise as quantise, quantize as quantize
from ._value import (
    FORMATS as FORMATS,
    QuantisedArray as QuantisedArray,
    QuantisedScale as QuantisedScale,
    QuantMaterialisationError as QuantMaterialisationError,
)


QuantizedArray = QuantisedArray
quantize_model = quantise_model
save_quantized = save_quantised
load_quantized = load_quantised


# Every family names its refusal after itself (`QuantMaterialisationError`), so
# that the errors of families imported side by side, and the core's
# `quax.MaterialisationError` they subclass, keep distinct names. 0.5.0 documented this
# one as `quax_quant.MaterialisationError`: kept as an alias, the same class.
MaterialisationError = QuantMaterialisationError
