"""``Block.summary``: one call of a block with a forward hook on every layer, printed as a
table of each layer's output shape and parameter count (MXNet 1.x's layout)."""

from __future__ import annotations

from collections import OrderedDict

_LINE = "{:>20}  {:>42} {:>15}"


def print_summary(block, inputs) -> None:
    rows: OrderedDict = OrderedDict()
    rows["Input"] = _row(_shapes(inputs), 0, 0, 0)
    seen: set = set()
    handles = []

    def record(layer, _inputs, outputs):
        total = trainable = shared = 0
        for param in layer.params.values():
            size = param.data().size
            total += size
            trainable += 0 if param.grad_req == "null" else size
            shared += size if id(param) in seen else 0
            seen.add(id(param))
        rows[f"{type(layer).__name__}-{len(rows)}"] = _row(_shapes(outputs), total,
                                                           trainable, shared)

    def hook(layer):
        if getattr(layer, "_active", False):
            raise AssertionError(f"{layer.name!r} is hybridized: its layers are not called "
                                 f"one by one, so summary() cannot see them; call it before "
                                 f"hybridize()")
        if not layer._container:  # a container's rows are its children's
            handles.append(layer.register_forward_hook(record))

    try:
        block.apply(hook)
        block(*inputs)
    finally:
        for handle in handles:
            handle.detach()
    _print(rows)


def _row(shape, total: int, trainable: int, shared: int) -> dict:
    return {"output_shape": shape, "n_params": total, "trainable": trainable,
            "shared": shared}


def _shapes(values):
    if isinstance(values, (list, tuple)):
        shapes = [_shapes(v) for v in values]
        return shapes[0] if len(shapes) == 1 else shapes
    return getattr(values, "shape", values)


def _print(rows: OrderedDict) -> None:
    print("-" * 80)
    print(_LINE.format("Layer (type)", "Output Shape", "Param #"))
    print("=" * 80)
    for name, row in rows.items():
        print(_LINE.format(name, str(row["output_shape"]), row["n_params"]))
    total = sum(r["n_params"] for r in rows.values())
    trainable = sum(r["trainable"] for r in rows.values())
    shared = sum(r["shared"] for r in rows.values())
    print("=" * 80)
    print("Parameters in forward computation graph, duplicate included")
    print(f"   Total params: {total}")
    print(f"   Trainable params: {trainable}")
    print(f"   Non-trainable params: {total - trainable}")
    print(f"Shared params in forward computation graph: {shared}")
    print(f"Unique parameters in model: {total - shared}")
    print("-" * 80)
