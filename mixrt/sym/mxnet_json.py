"""MXNet 1.x's own symbol files (``prefix-symbol.json``, nnvm's graph JSON) read into a Symbol.

    {"nodes": [{"op": "null", "name": "data", "inputs": []},
               {"op": "Convolution", "name": "conv0", "attrs": {"kernel": "(3, 3)", ...},
                "inputs": [[0, 0, 0], [1, 0, 0]]}, ...],
     "arg_nodes": [0, 1], "node_row_ptr": [...], "heads": [[5, 0, 0]],
     "attrs": {"mxnet_version": ["int", 10901]}}

Each node is rebuilt by mixrt's MXNet-named symbol function for its op (``sym.Convolution``,
``sym.BatchNorm``, ...) or, where MXNet's op is one ONNX operator, by that operator, with the
node's inputs in MXNet's argument order and its parameters parsed from MXNet's strings
(``"(3, 3)"``, ``"True"``, ``"1e-05"``, ``"None"``). Node names are kept, so the arguments and
auxiliary states are named as the ``.params`` file's keys (``arg:conv0_weight``,
``aux:bn0_moving_mean``), and variables keep their declared shape, dtype, initializer and
learning-rate multipliers. Every index, op and parameter is checked: a malformed or hostile
file, or an op this reader does not know, raises ModelLoadError naming the node.

The reading lives here (the document's layout, its nodes and references, the variables'
declarations, MXNet's parameter strings); what each operator becomes is
``mxnet_json_ops.py`` (and ``fused_rnn.py`` for the fused RNN), whose tables make
:data:`OPERATORS`. mixrt writes its own symbol JSON, not MXNet's (``serialize.py``).
"""

from __future__ import annotations

from mixrt.base.errors import MixrtError, ModelLoadError
from mixrt.nd.serialization import DTYPES
from mixrt.sym import fused_rnn, mxnet_json_ops
from mixrt.sym.mxnet_json_ops import is_integer
from mixrt.sym.symbol import variable_named, Group, Symbol

MAX_PARAMETER_TEXT = 4096  # MXNet writes short strings; a megabyte one is not a parameter
# MXNet's dtype codes (mshadow's TypeFlag) in a variable's "__dtype__", as in its .params
# files
DTYPE_CODES = DTYPES
# a variable's attributes that are declarations rather than the user's own
DECLARATION_KEYS = ("__shape__", "__dtype__", "__init__", "__lr_mult__", "__wd_mult__")
# inputs of these ops that are auxiliary states (updated by the op, not learned)
AUXILIARY_INPUTS = {"BatchNorm": (3, 4), "_contrib_SyncBatchNorm": (3, 4)}
# MXNet's operator name -> its translation (node name, inputs, parsed params) -> Symbol
OPERATORS = {**mxnet_json_ops.OPERATORS, **fused_rnn.OPERATORS}


def is_mxnet_document(document) -> bool:
    """Whether parsed JSON has MXNet's graph layout (and not mixrt's own "format")."""
    return (isinstance(document, dict) and "format" not in document
            and all(key in document for key in ("nodes", "heads", "arg_nodes")))


def symbol_from_document(document: dict, source: str) -> Symbol:
    nodes = _list(document, "nodes", source)
    auxiliary = _auxiliary_nodes(nodes, source)
    built: list[Symbol] = []
    for index, entry in enumerate(nodes):
        where = f"{source}: node {index}"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{where}: expected an object, got {_brief(entry)}")
        built.append(_node(entry, built, index in auxiliary, where))
    heads = [_entry(head, built, f"{source}: heads") for head in _list(document, "heads",
                                                                        source)]
    if not heads:
        raise ModelLoadError(f"{source}: the symbol has no outputs (\"heads\" is empty)")
    return heads[0] if len(heads) == 1 else Group(heads)


def _list(document: dict, key: str, source: str) -> list:
    value = document.get(key)
    if not isinstance(value, list):
        raise ModelLoadError(f"{source}: {key!r} must be a list, got {_brief(value)}")
    return value


def _auxiliary_nodes(nodes: list, source: str) -> set:
    """The variables some op reads as an auxiliary state (BatchNorm's moving mean and
    variance): MXNet tells them apart by the op, not by the variable."""
    auxiliary = set()
    for entry in nodes:
        positions = AUXILIARY_INPUTS.get(entry.get("op")) if isinstance(entry, dict) else None
        inputs = entry.get("inputs") if positions else None
        if isinstance(inputs, list):
            auxiliary.update(ref[0] for position, ref in enumerate(inputs)
                             if position in positions and isinstance(ref, list) and ref
                             and is_integer(ref[0]))
    return auxiliary


def _node(entry: dict, built: list[Symbol], auxiliary: bool, where: str) -> Symbol:
    op, name = entry.get("op"), entry.get("name")
    if not isinstance(name, str) or not name:
        raise ModelLoadError(f"{where}: missing or empty \"name\"")
    where = f"{where} ({name!r})"
    if not isinstance(op, str) or not op:
        raise ModelLoadError(f"{where}: \"op\" must be an operator name or \"null\", got "
                             f"{_brief(op)}")
    attrs = _attributes(entry, where)
    inputs = entry.get("inputs", [])
    if not isinstance(inputs, list):
        raise ModelLoadError(f"{where}: \"inputs\" must be a list, got {_brief(inputs)}")
    if op == "null":
        if inputs:
            raise ModelLoadError(f"{where}: a variable (op \"null\") has no inputs")
        return _variable(name, attrs, auxiliary, where)
    translate = OPERATORS.get(op)
    if translate is None:
        raise ModelLoadError(f"{where}: MXNet operator {op!r} is not supported by this "
                             f"reader")
    operands = [_entry(ref, built, where) for ref in inputs]
    params = {key: _parse(value, f"{where}.{key}") for key, value in attrs.items()
              if not _is_symbol_attribute(key)}
    try:
        symbol = translate(name, operands, params)
    except (MixrtError, TypeError, ValueError, OverflowError) as error:
        raise ModelLoadError(f"{where}: MXNet operator {op!r} with {params}: {error}") from None
    annotations = {k: v for k, v in attrs.items() if _is_symbol_attribute(k)}
    if annotations and len(symbol.list_outputs()) == 1:
        symbol._set_attr(**annotations)
    return symbol


def _attributes(entry: dict, where: str) -> dict:
    """The node's "attrs"; files of MXNet before 0.9 split them into the op's "param" and
    the user's "attr"."""
    parts = [entry["attrs"]] if "attrs" in entry else [entry.get("param", {}),
                                                      entry.get("attr", {})]
    for part in parts:
        if not isinstance(part, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in part.items()):
            raise ModelLoadError(f"{where}: \"attrs\" must map strings to strings, got "
                                 f"{_brief(part)}")
    return {key: value for part in parts for key, value in part.items()}


def _entry(ref, built: list[Symbol], where: str) -> Symbol:
    """An input reference [node, output, version] (MXNet < 1.0 writes [node, output])."""
    if not isinstance(ref, list) or len(ref) not in (2, 3) or not all(map(is_integer, ref)):
        raise ModelLoadError(f"{where}: an input is [node index, output index, version], "
                             f"got {_brief(ref)}")
    node, output = ref[0], ref[1]
    if not 0 <= node < len(built):
        raise ModelLoadError(f"{where}: refers to node {node}, but only nodes 0.."
                             f"{len(built) - 1} come before it")
    outputs = len(built[node].list_outputs())
    if not 0 <= output < outputs:
        raise ModelLoadError(f"{where}: node {node} ({built[node].list_outputs()[0]!r}) has "
                             f"{outputs} output(s); output {output} was asked for")
    return built[node] if outputs == 1 else built[node][output]


def _is_symbol_attribute(key: str) -> bool:
    """MXNet's attributes of any node (``__lr_mult__``, ``__ctx_group__``), not op params."""
    return key.startswith("__") and key.endswith("__") and len(key) > 4


# -- variables ---------------------------------------------------------------------------------

def _variable(name: str, attrs: dict, auxiliary: bool, where: str) -> Symbol:
    shape = _parse(attrs["__shape__"], f"{where}.__shape__") if "__shape__" in attrs else None
    if shape is not None and (not isinstance(shape, tuple)
                              or not all(is_integer(d) and d >= -1 for d in shape)):
        raise ModelLoadError(f"{where}: \"__shape__\" must be a tuple of whole numbers, got "
                             f"{_brief(attrs['__shape__'])}")
    dtype = _dtype(attrs["__dtype__"], where) if "__dtype__" in attrs else None
    multipliers = {key: _multiplier(attrs, key, where) for key in ("lr_mult", "wd_mult")}
    own = {k: v for k, v in attrs.items() if k not in DECLARATION_KEYS}
    try:
        # mixrt's initializers take MXNet's "__init__" as it is: a name or dumps()' JSON
        return variable_named(name, shape, dtype, attrs.get("__init__"),
                              aux=auxiliary, attr=own or None, **multipliers)
    except (MixrtError, TypeError, ValueError, OverflowError) as error:
        raise ModelLoadError(f"{where}: bad variable declaration: {error}") from None


def _dtype(text: str, where: str) -> str:
    code = _parse(text, f"{where}.__dtype__")
    if is_integer(code) and code in DTYPE_CODES:
        return DTYPE_CODES[code]
    if isinstance(code, str) and code in DTYPE_CODES.values():
        return code
    raise ModelLoadError(f"{where}: \"__dtype__\" {_brief(text)} is not one of MXNet's dtype "
                         f"codes {sorted(DTYPE_CODES)}")


def _multiplier(attrs: dict, key: str, where: str):
    text = attrs.get(f"__{key}__")
    if text is None:
        return None
    value = _parse(text, f"{where}.__{key}__")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < float("inf"):
        raise ModelLoadError(f"{where}: \"__{key}__\" must be a finite number >= 0, got "
                             f"{_brief(text)}")
    return float(value)


# -- MXNet's parameter strings -----------------------------------------------------------------

def _parse(text: str, where: str):
    """``"(3, 3)"`` -> (3, 3), ``"True"`` -> True, ``"1e-05"`` -> 1e-05, ``"None"`` -> None;
    anything else is a string (``"relu"``, ``"float32"``)."""
    if len(text) > MAX_PARAMETER_TEXT:
        raise ModelLoadError(f"{where}: a parameter of {len(text)} characters (at most "
                             f"{MAX_PARAMETER_TEXT})")
    text = text.strip()
    if text[:1] in "([" and text[-1:] in ")]" and text:
        inner = text[1:-1].strip().rstrip(",")
        items = [item.strip() for item in inner.split(",")] if inner else []
        if any(item[:1] in "([" for item in items):
            raise ModelLoadError(f"{where}: nested tuples are not MXNet parameters: "
                                 f"{_brief(text)}")
        return tuple(_scalar(item) for item in items)
    return _scalar(text)


def _scalar(text: str):
    named = {"None": None, "True": True, "False": False, "true": True, "false": False}
    if text in named:
        return named[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."
