"""Small builders for test models."""

import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def add_model(shape=(2, 3), opset=21, dtype=TensorProto.FLOAT, names=("x", "y")):
    """z = x + y: the smallest model that exercises feeds of two inputs."""
    node = helper.make_node("Add", list(names), ["z"], name="add_node")
    inputs = [helper.make_tensor_value_info(n, dtype, list(shape)) for n in names]
    graph = helper.make_graph([node], "add", inputs,
                              [helper.make_tensor_value_info("z", dtype, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def loop_model(size: int = 4, trips_shape=()):
    """``y = x + 1`` as many times as the input ``trips`` says (a Loop named "repeat", its
    body's Add "step"): a request decides how long its run takes (10**9 trips: hours)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="step")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [size])],
        [numpy_helper.from_array(np.ones(size, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="repeat", body=body)],
        "loop",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, list(trips_shape)),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def weighted_model(weight: np.ndarray, external: dict | None = None):
    """y = x * w with ``w`` an initializer, optionally marked external with ``external``."""
    tensor = numpy_helper.from_array(weight, "w")
    if external is not None:
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in external.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    node = helper.make_node("Mul", ["x", "w"], ["y"], name="scale")
    graph = helper.make_graph(
        [node], "weighted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(weight.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(weight.shape))],
        initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def save(model, path) -> str:
    with open(path, "wb") as handle:
        handle.write(model.SerializeToString())
    return str(path)


def mlp_graph(inputs=64, hidden=32, outputs=10, seed=0, dtype=np.float32,
              scales=(0.2, 0.2)):
    """x -> Gemm -> Relu ("features") -> Gemm ("out"), weights normal * ``scales``."""
    from mixrt.ops.ir.types import TensorType  # noqa: PLC0415
    from mixrt.runtime.graph import Graph, Node, Value  # noqa: PLC0415
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    g = Graph(name="mlp", opsets={"": 17})
    g.inputs = [Value("x", TensorType(dtype, ("N", inputs)))]
    g.initializers = {
        "w1": (rng.standard_normal((inputs, hidden)) * scales[0]).astype(dtype),
        "b1": np.zeros(hidden, dtype),
        "w2": (rng.standard_normal((hidden, outputs)) * scales[1]).astype(dtype),
        "b2": np.zeros(outputs, dtype)}
    g.nodes = [Node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", opset=17),
               Node("Relu", ["h"], ["features"], name="relu", opset=17),
               Node("Gemm", ["features", "w2", "b2"], ["out"], name="fc2", opset=17)]
    g.outputs = [Value("out")]
    return g


def flat_digits():
    """The digits split into train and test, images flattened to 64 features."""
    from mixrt.models.digits import load_digits, split  # noqa: PLC0415
    (xt, yt), (xe, ye) = split(*load_digits())
    return xt.reshape(len(xt), -1), yt, xe.reshape(len(xe), -1), ye


def central_difference(executor, feeds: dict, array: np.ndarray, index, eps: float = 1e-6):
    """d(loss)/d(array[index]) by central differences through ``executor``'s training forward
    (its first output is the loss); ``array`` is restored afterwards. The executor's
    outputs are arrays it writes again on each forward, as MXNet's are: read each loss out
    before the next run."""
    keep = float(array[index])
    array[index] = keep + eps
    up = np.array(executor.forward(is_train=True, **feeds)[0], dtype=np.float64)
    array[index] = keep - eps
    down = np.array(executor.forward(is_train=True, **feeds)[0], dtype=np.float64)
    array[index] = keep
    return (up - down) / (2 * eps)


def until_the_worker_joins(block, joined_index, job, seconds: float = 10.0):
    """Repeat ``job`` until the native pool's worker has taken part in one of its runs.

    The worker spins, then sleeps on a futex; on a loaded machine (another test process on the
    other core) it can miss dozens of short jobs in a row, so a fixed count of runs is flaky.
    It must still join within a few seconds, or the pool is broken."""
    joined = block[joined_index]
    deadline = time.monotonic() + seconds
    while True:
        job()
        if block[joined_index] > joined:
            return
        assert time.monotonic() < deadline, "the worker never took part in a job"


def nvrtc():
    """NVRTC, CUDA's runtime compiler (a library from a pip wheel: no GPU needed), or None."""
    import ctypes
    import glob
    import os
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for path in sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.[0-9]*"))):
            # NVRTC opens its builtins by name when it compiles, and a wheel's folder is on no
            # loader path: loaded first from beside it, that name is found already loaded
            folder = os.path.dirname(path)
            for builtins in glob.glob(os.path.join(folder, "libnvrtc-builtins.so.[0-9]*")):
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
    return None


def nvrtc_compile(source: str) -> tuple[int, str]:
    """(NVRTC's status, its log) compiling ``source`` for Hopper (compute_90)."""
    import ctypes
    library = nvrtc()
    program = ctypes.c_void_p()
    assert library.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"mixrt.cu", 0,
                                      None, None) == 0
    options = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
    status = library.nvrtcCompileProgram(program, 1, options)
    size = ctypes.c_size_t()
    library.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    library.nvrtcGetProgramLog(program, log)
    library.nvrtcDestroyProgram(ctypes.byref(program))
    return status, log.value.decode()


def kernel_source(kernel: str, dtype, **flags) -> str:
    """The CUDA C of a multi-tensor optimizer kernel: "sgd" and "adam" (the engine's
    PyTorch-style kinds, ``torch_sgd.py`` and ``torch_adam.py``), "mxnet_sgd" (MXNet's
    SGD's definition, ``sgd.py``)."""
    from mixrt.runtime.training.optimizers import sgd, torch_adam, torch_sgd
    module = {"sgd": torch_sgd, "adam": torch_adam, "mxnet_sgd": sgd}[kernel]
    return module.source(dtype, **flags)


def counted_optimizer_launches(monkeypatch) -> list:
    """The names of the multi-tensor optimizer kernels (runtime/training/optimizers/)
    launched from now on, in order, in the list returned."""
    from mixrt.runtime.training import optimizer_kernels
    launches: list = []
    made = optimizer_kernels.raw_kernel

    def counted(xp, code, kernel_name):
        kernel = made(xp, code, kernel_name)
        return lambda *args: (launches.append(kernel_name), kernel(*args))[1]
    monkeypatch.setattr(optimizer_kernels, "raw_kernel", counted)
    return launches


def unbound_run(session, feeds: dict, monkeypatch):
    """``session``'s first output for ``feeds`` with its steps called afresh, none bound
    (``run_loop.BIND`` off for the run): what a bound run must give, bit for bit."""
    from mixrt.runtime import run_loop  # noqa: PLC0415  (mixrt's own: imported by its tests)
    monkeypatch.setattr(run_loop, "BIND", False)
    try:
        return session.run(None, feeds)[0]
    finally:
        monkeypatch.setattr(run_loop, "BIND", True)
