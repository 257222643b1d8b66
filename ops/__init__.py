"""mixrt's operators: one module per family, all registered in :data:`REGISTRY`.

Importing this package imports every family module, which registers its kernels.
"""

from mixrt.ops.registry import REGISTRY, Kernel, op  # noqa: F401
from mixrt.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    attention,
    cast,
    control,
    conv,
    elementwise,
    image,
    index,
    linalg,
    loss,
    ml,
    nn,
    pool,
    quantize,
    random,
    reduce,
    rnn,
    sequence,
    shape,
    signal,
    string,
    training,
)

__all__ = ["REGISTRY", "Kernel", "op"]
