"""The model zoo.

Written with mixrt.sym (the training issue): ``mlp``, ``lenet``, ``resnet`` (v1, depths 18 to
152) and ``transformer_encoder``; ``get_symbol(name, **options)`` picks one by name and
``layers.with_loss`` adds the training loss. Also here: the main job's digits data and CNN
(``digits``) and the 9 light ONNX models the benchmarks use (``zoo``).
"""

from __future__ import annotations


def get_symbol(name: str, **options):
    """A zoo symbol by name: "mlp", "lenet", "resnet18" ... "resnet152", "transformer"."""
    from mixrt.models.lenet import lenet  # noqa: PLC0415 (mixrt.sym and onnx, on demand)
    from mixrt.models.mlp import mlp  # noqa: PLC0415 (the same)
    from mixrt.models.resnet import SPECS, resnet  # noqa: PLC0415 (the same)
    from mixrt.models.transformer import transformer_encoder  # noqa: PLC0415 (the same)

    builders = {"mlp": mlp, "lenet": lenet, "transformer": transformer_encoder}
    builders.update({f"resnet{depth}": (lambda d: lambda **o: resnet(d, **o))(depth)
                     for depth in SPECS})
    if name not in builders:
        raise ValueError(f"unknown zoo model {name!r}; known: {sorted(builders)}")
    return builders[name](**options)
