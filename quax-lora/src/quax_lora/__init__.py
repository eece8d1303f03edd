"""quax-lora: LoRA arrays for quax, to fine-tune any Equinox model.

```python
import quax, quax_lora
lora_model = quax_lora.loraify(model, rank=8, key=key)
y = quax.quaxify(lora_model)(x)
```
"""

from . import _rules as _rules  # registers the rules
from ._init_base_changing import convert_to_lora as convert_to_lora
from ._model import (
    LegacyAdapterWarning as LegacyAdapterWarning,
    ParameterCount as ParameterCount,
    adapter_filter as adapter_filter,
    count_parameters as count_parameters,
    is_lora as is_lora,
    load_adapter as load_adapter,
    loraify as loraify,
    merge as merge,
    save_adapter as save_adapter,
    trainable_filter as trainable_filter,
    unmerge as unmerge,
)
from ._peft import MixedDropoutWarning as MixedDropoutWarning
from ._serving import (
    AdapterBuckets as AdapterBuckets,
    bucket_by_rank as bucket_by_rank,
    for_serving as for_serving,
    serve_by_bucket as serve_by_bucket,
    stack_mixed_ranks as stack_mixed_ranks,
)
from ._value import (
    CorruptAdapterError as CorruptAdapterError,
    LoraArray as LoraArray,
    LoraMaterialisationError as LoraMaterialisationError,
    LoraWarning as LoraWarning,
    RankWarning as RankWarning,
)
from ._variants import (
    select_adapter as select_adapter,
    stack_adapters as stack_adapters,
    unstack_adapters as unstack_adapters,
    with_dropout_key as with_dropout_key,
)


# Every family names its refusal after itself (`LoraMaterialisationError`), so
# that the errors of families imported side by side, and the core's
# `quax.MaterialisationError` they subclass, keep distinct names. 0.5.0 documented this
# one as `quax_lora.MaterialisationError`: kept as an alias, the same class.
MaterialisationError = LoraMaterialisationError
