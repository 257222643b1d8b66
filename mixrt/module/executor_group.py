"""MXNet's ``DataParallelExecutorGroup``: one symbol bound once per context, each executor
taking a slice of every batch along its batch axis.

    group = DataParallelExecutorGroup(net, [mx.cpu(0), mx.cpu(1)], None,
                                      [("data", (10, 5))], [("softmax_label", (10,))],
                                      param_names, for_training=True, inputs_need_grad=False)
    group.forward(batch, is_train=True); group.backward(); group.get_outputs()

The parameters are bound once per executor (``param_arrays[i][k]`` is parameter ``i`` on
context ``k``) and are meant to hold the same values; ``get_params`` averages them.
A ``shared_group`` lends its parameter, gradient and input arrays by name (MXNet's
BucketingModule binds every bucket against the default one this way), so the groups share
memory. Host contexts (``cpu(0)``, ``cpu(1)``) are all main memory, as in MXNet.
"""

from __future__ import annotations

import warnings

import logging

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.io_base import DataDesc
from mixrt.sym.executor import Executor


def split_input_slice(batch_size: int, work_load_list) -> list[slice]:
    """The batch rows each executor takes, in proportion to ``work_load_list``."""
    total = float(sum(work_load_list))
    counts = [int(round(batch_size * w / total)) for w in work_load_list]
    counts[-1] = batch_size - sum(counts[:-1])  # rounding leftovers go to the last one
    slices, start = [], 0
    for count in counts:
        if count <= 0:
            raise InputError(f"work_load_list {list(work_load_list)} leaves an executor "
                             f"no rows of a batch of {batch_size}; use a larger batch")
        slices.append(slice(start, start + count))
        start += count
    return slices


def _descs(shapes) -> list:
    return [s if isinstance(s, DataDesc) else DataDesc(*s) for s in shapes or []]


def _batch_axis(desc) -> int:
    return DataDesc.get_batch_axis(getattr(desc, "layout", None))


def _output_batch_axes(symbol) -> list[int]:
    """Each output's batch axis, from its ``__layout__`` attribute (axis 0 without one)."""
    axes = []
    for index in range(len(symbol.list_outputs())):
        attr = getattr(symbol[index], "attr", None)
        axes.append(DataDesc.get_batch_axis(attr("__layout__") if callable(attr) else None))
    return axes


class DataParallelExecutorGroup:
    def __init__(self, symbol, contexts, workload, data_shapes, label_shapes, param_names,
                 for_training, inputs_need_grad, shared_group=None, logger=logging,
                 fixed_param_names=None, grad_req="write", state_names=None,
                 group2ctxs=None):
        self.symbol = symbol
        self.contexts = [as_context(c) for c in contexts]
        self.workload = list(workload) if workload is not None else [1] * len(contexts)
        self.group2ctxs = _group2ctxs(group2ctxs, len(self.contexts))
        self.param_names = list(param_names)
        self.arg_names = symbol.list_arguments()
        self.aux_names = symbol.list_auxiliary_states()
        self.output_names = symbol.list_outputs()
        self.output_layouts = _output_batch_axes(symbol)
        self.for_training, self.inputs_need_grad = for_training, inputs_need_grad
        self.logger = logger
        self.fixed_param_names = list(fixed_param_names or [])
        self.state_names = list(state_names or [])
        self.shared_data_arrays = shared_group.shared_data_arrays if shared_group else \
            [{} for _ in self.contexts]
        self.grad_req = self._grad_reqs(grad_req if for_training else "null",
                                        data_shapes, label_shapes)
        self.execs: list[Executor] = []
        self.bind_exec(data_shapes, label_shapes, shared_group)

    def _grad_reqs(self, grad_req, data_shapes, label_shapes) -> dict:
        """Parameters as asked (fixed ones "null"), data "write" only for
        ``inputs_need_grad``, labels and states "null"."""
        data_names = [d.name for d in _descs(data_shapes)]
        if isinstance(grad_req, dict):
            return {n: grad_req.get(n, "null") for n in self.arg_names}
        reqs = {}
        for index, name in enumerate(self.arg_names):
            asked = grad_req[index] if isinstance(grad_req, (list, tuple)) else grad_req
            if name in self.param_names:
                reqs[name] = "null" if name in self.fixed_param_names else asked
            elif name in data_names:
                reqs[name] = asked if self.inputs_need_grad else "null"
            else:
                reqs[name] = "null"
        return reqs

    # -- binding -----------------------------------------------------------------------------

    def decide_slices(self, data_shapes) -> list[int]:
        """Each input's batch axis, and the slices of the batch per executor."""
        axes = [_batch_axis(desc) for desc in data_shapes]
        sizes = {desc.shape[axis] for desc, axis in zip(data_shapes, axes) if axis >= 0}
        if len(sizes) > 1:
            raise InputError(f"all data must have the same batch size: "
                             f"{[(d.name, d.shape) for d in data_shapes]}")
        self.batch_size = sizes.pop() if sizes else 1
        self.slices = split_input_slice(self.batch_size, self.workload)
        return axes

    def bind_exec(self, data_shapes, label_shapes, shared_group=None, reshape=False):
        """Bind (or, with ``reshape``, reshape) one executor per context."""
        self.data_shapes, self.label_shapes = _descs(data_shapes), _descs(label_shapes)
        self.data_names = [d.name for d in self.data_shapes]
        self.label_names = [d.name for d in self.label_shapes]
        self.data_layouts = self.decide_slices(self.data_shapes)
        self.label_layouts = [_batch_axis(d) for d in self.label_shapes] \
            if self.label_shapes else None
        for index in range(len(self.contexts)):
            shapes = self._sliced_shapes(index)
            if reshape:
                self.execs[index] = self.execs[index].reshape(
                    partial_shaping=True, allow_up_sizing=True, **shapes)
            else:
                self.execs.append(self._bind_ith_exec(index, shapes, shared_group))
        self._collect_arrays()

    def reshape(self, data_shapes, label_shapes):
        """Rebind for new input shapes, reusing the executors' memory where it fits."""
        if _descs(data_shapes) == self.data_shapes and \
                _descs(label_shapes) == self.label_shapes:
            return
        self.bind_exec(data_shapes, label_shapes, reshape=True)

    def _sliced_shapes(self, index: int) -> dict:
        part = self.slices[index]
        shapes = {}
        for desc, axis in zip(self.data_shapes + self.label_shapes,
                              self.data_layouts + (self.label_layouts or [])):
            shape = list(desc.shape)
            if axis >= 0:
                shape[axis] = part.stop - part.start
            shapes[desc.name] = tuple(shape)
        return shapes

    def _inferred_shapes(self, shapes: dict) -> tuple:
        """(argument shapes, auxiliary shapes) from the input ``shapes``. Output layers
        read labels for their size only, so their given shapes stand ((batch,) for a
        (batch, 1) regression output, as in MXNet) and inference first goes without them;
        a label that is reshaped before the output layer (a sequence's (batch, T) labels
        flattened) is all that determines that layer's shapes, so then it goes with them."""
        without_labels = {n: s for n, s in shapes.items() if n not in self.label_names}
        arg_shapes, _, aux_shapes = _quietly_inferred(self.symbol, without_labels)
        if arg_shapes is None and len(without_labels) < len(shapes):
            arg_shapes, _, aux_shapes = _quietly_inferred(self.symbol, shapes)
        return arg_shapes, aux_shapes

    def _bind_ith_exec(self, index: int, shapes: dict, shared_group) -> Executor:
        ctx = self.contexts[index]
        arg_shapes, aux_shapes = self._inferred_shapes(shapes)
        if arg_shapes is not None:
            arg_shapes = [shapes.get(n, s) if n in self.label_names else s
                          for n, s in zip(self.arg_names, arg_shapes)]
        if arg_shapes is None:
            raise InputError(f"bind: the shapes {shapes} do not determine every argument "
                             f"of the symbol {self.arg_names}")
        given_types = {d.name: d.dtype for d in self.data_shapes + self.label_shapes}
        arg_types, _, aux_types = self.symbol.infer_type(**given_types)
        shared = shared_group.execs[index] if shared_group is not None else None
        args, grads = {}, {}
        for name, shape, dtype in zip(self.arg_names, arg_shapes, arg_types):
            place = self._context_of(name, index)
            args[name] = self._array(name, shape, dtype, place, shared, "arg_dict", index)
            if self.grad_req[name] != "null":
                grads[name] = self._array(name, shape, dtype, place, shared, "grad_dict",
                                          index)
        aux = {name: self._array(name, shape, dtype, self._context_of(name, index),
                                 shared, "aux_dict", index)
               for name, shape, dtype in zip(self.aux_names, aux_shapes, aux_types)}
        return Executor(self.symbol, ctx, args, grads, self.grad_req, aux)

    def _context_of(self, name: str, index: int):
        """The context of a variable's arrays: its ``ctx_group``'s in ``group2ctxs``."""
        attributes = _attributes(self.symbol).get(name, {})
        # MXNet's AttrScope(ctx_group=...) writes both keys; a symbol may carry either
        group = attributes.get("__ctx_group__", attributes.get("ctx_group"))
        placed = self.group2ctxs[index].get(group) if group is not None else None
        return as_context(placed) if placed is not None else self.contexts[index]

    def _array(self, name, shape, dtype, ctx, shared, table: str, index: int):
        """A zero array for ``name``, or the shared group's (same memory) when it has one
        of this shape; inputs are kept per context in ``shared_data_arrays``."""
        dtype = np.dtype(dtype or np.float32)
        shape = tuple(shape)
        if name in self.param_names or name in self.aux_names:
            lent = getattr(shared, table, {}).get(name) if shared is not None else None
            if lent is not None and lent.shape == shape:
                return lent
            return nd.zeros(shape, ctx=ctx, dtype=dtype)
        if table == "grad_dict":
            return nd.zeros(shape, ctx=ctx, dtype=dtype)
        inputs = self.shared_data_arrays[index]
        kept = inputs.get(name)
        if kept is not None and kept.shape == shape and kept.dtype == dtype:
            return kept
        inputs[name] = nd.zeros(shape, ctx=ctx, dtype=dtype)
        return inputs[name]

    def _collect_arrays(self):
        """The per-name lists of the executors' arrays MXNet's Module reads."""
        def per_exec(table, name):
            return [getattr(e, table)[name] for e in self.execs]

        self.data_arrays = [[(self.slices[i], e.arg_dict[name])
                             for i, e in enumerate(self.execs)] for name in self.data_names]
        self.label_arrays = [[(self.slices[i], e.arg_dict[name])
                              for i, e in enumerate(self.execs)]
                             for name in self.label_names] if self.label_names else None
        self.state_arrays = [per_exec("arg_dict", name) for name in self.state_names]
        self.param_arrays = [per_exec("arg_dict", name) for name in self.arg_names
                             if name in self.param_names]
        self.grad_arrays = [per_exec("grad_dict", name) for name in self.arg_names
                            if name in self.param_names and self.grad_req[name] != "null"] \
            if self.for_training else None
        self.aux_arrays = [per_exec("aux_dict", name) for name in self.aux_names]
        self.input_grad_arrays = [per_exec("grad_dict", name) for name in self.data_names
                                  if self.grad_req.get(name, "null") != "null"] \
            if self.inputs_need_grad else None

    def param_names_in_order(self) -> list[str]:
        """The parameters in the symbol's argument order (that of ``param_arrays``)."""
        return [n for n in self.arg_names if n in self.param_names]

    @property
    def _total_exec_bytes(self) -> int:
        """The memory the executors' plans allocate, in MB (what MXNet's debug_str says)."""
        return sum(e._planned_bytes() // (1 << 20) for e in self.execs)

    # -- parameters -------------------------------------------------------------------------

    def set_params(self, arg_params, aux_params, allow_extra=False):
        for executor in self.execs:
            executor.copy_params_from(arg_params, aux_params, allow_extra_params=allow_extra)

    def get_params(self, arg_params, aux_params):
        """Copy the parameters, averaged over the executors, into the given dicts' arrays."""
        for names, blocks, target in ((
                [n for n in self.arg_names if n in self.param_names], self.param_arrays,
                arg_params), (self.aux_names, self.aux_arrays, aux_params)):
            for name, block in zip(names, blocks):
                mean = sum(a.asnumpy().astype(np.float64) for a in block) / len(block)
                target[name][:] = mean.astype(target[name].dtype)

    def get_states(self, merge_multi_context=True):
        if merge_multi_context:
            raise InputError("get_states: merge_multi_context=True is not offered (as in "
                             "MXNet); pass merge_multi_context=False")
        return self.state_arrays

    def set_states(self, states=None, value=None):
        """Set the state arrays from ``states`` (``[[state1_dev1, ...], ...]``) or to
        ``value``; exactly one of the two."""
        if (states is None) == (value is None):
            raise InputError("set_states: give exactly one of states and value")
        for index, targets in enumerate(self.state_arrays):
            for k, target in enumerate(targets):
                target[:] = value if value is not None else \
                    states[index][k].as_in_context(target.ctx)

    # -- running ----------------------------------------------------------------------------

    def forward(self, data_batch, is_train=None):
        """Copy each executor's slice of the batch in (its labels too, when it has them,
        whether training or not: a symbol computing its loss from the labels, as
        ``make_loss`` ones do, needs them to score), then run forward on every one."""
        is_train = self.for_training if is_train is None else is_train
        self._load(self.data_arrays, data_batch.data, self.data_layouts)
        label = getattr(data_batch, "label", None)
        if label and self.label_arrays is not None:
            self._load(self.label_arrays, label, self.label_layouts)
        for executor in self.execs:
            executor.forward(is_train=is_train)

    def _load(self, targets, sources, axes) -> None:
        for source, parts, axis in zip(sources, targets, axes):
            for part, target in parts:
                piece = _take(source, part, axis) if len(parts) > 1 else source
                host = piece.asnumpy() if isinstance(piece, nd.NDArray) else piece
                target[:] = np.asarray(host, dtype=target.dtype)

    def backward(self, out_grads=None):
        if not self.for_training:
            raise InputError("backward: re-bind with for_training=True to run backward")
        for index, executor in enumerate(self.execs):
            grads = None
            if out_grads is not None:
                grads = [_take(g, self.slices[index], axis) if len(self.execs) > 1 else g
                         for g, axis in zip(out_grads, self.output_layouts)]
            executor.backward(out_grads=grads)

    def get_outputs(self, merge_multi_context=True, begin=0, end=None):
        end = len(self.output_names) if end is None else end
        outputs = [[e.outputs[i] for e in self.execs] for i in range(begin, end)]
        if not merge_multi_context:
            return outputs
        return _merge(outputs, self.output_layouts[begin:end])

    def get_input_grads(self, merge_multi_context=True):
        if not self.inputs_need_grad:
            raise InputError("get_input_grads: bind with inputs_need_grad=True first")
        return _merge(self.input_grad_arrays, self.data_layouts) if merge_multi_context \
            else self.input_grad_arrays

    def update_metric(self, eval_metric, labels, pre_sliced=False):
        for index, executor in enumerate(self.execs):
            if pre_sliced:
                sliced = labels[index]
            else:
                sliced = [_take(label, self.slices[index], 0) if len(self.execs) > 1
                          else label for label in labels]
            eval_metric.update_dict(dict(zip(self.label_names, sliced)),
                                    dict(zip(self.output_names, executor.outputs)))

    def install_monitor(self, mon):
        for executor in self.execs:
            mon.install(executor)


def _take(array, part: slice, axis: int):
    if axis <= 0:
        return array[part]
    index = [slice(None)] * array.ndim
    index[axis] = part
    return array[tuple(index)]


def _merge(per_output: list, axes: list[int]) -> list:
    """Each output's pieces from the executors joined along its batch axis."""
    return [pieces[0] if len(pieces) == 1 else
            nd.concat(*[p.as_in_context(pieces[0].ctx) for p in pieces], dim=max(axis, 0))
            for pieces, axis in zip(per_output, axes)]


def _attributes(symbol) -> dict:
    attr_dict = getattr(symbol, "attr_dict", None)
    return attr_dict() if callable(attr_dict) else {}


def _group2ctxs(group2ctxs, count: int) -> list[dict]:
    """One {group: context} per executor; a list under a group gives one per executor."""
    if group2ctxs is None:
        return [{} for _ in range(count)]
    if isinstance(group2ctxs, (list, tuple)):
        if len(group2ctxs) != count:
            raise InputError(f"group2ctxs has {len(group2ctxs)} entries for {count} "
                             f"contexts")
        return [dict(g) for g in group2ctxs]
    per_exec = [{} for _ in range(count)]
    for group, ctxs in group2ctxs.items():
        ctxs = ctxs if isinstance(ctxs, (list, tuple)) else [ctxs] * count
        if len(ctxs) == 1:
            ctxs = ctxs * count
        if len(ctxs) != count:
            raise InputError(f"group2ctxs[{group!r}] has {len(ctxs)} contexts for {count} "
                             f"executors")
        for index, ctx in enumerate(ctxs):
            per_exec[index][group] = ctx
    return per_exec


__all__ = ["DataParallelExecutorGroup", "split_input_slice"]


def _quietly_inferred(symbol, shapes: dict) -> tuple:
    """``symbol.infer_shape(**shapes)`` without its warning for shapes it cannot complete:
    binding tries without the labels first, and says itself what stays unknown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return symbol.infer_shape(**shapes)
