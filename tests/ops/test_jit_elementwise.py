"""FusedElementwise programs compiled by ops/elementwise/jit_elementwise.py: the same bits as
the NumPy path for every compiled op, every broadcast layout, in place and split over threads;
what does not compile stays in NumPy; the generated module's cache on disk."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mixrt.ops.elementwise import fused_elementwise as fe
from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.elementwise import jit_elementwise as je
from mixrt.ops.elementwise import small_routines
from mixrt.ops.compiled import parallel

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not available")

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def compile_small_tensors(monkeypatch):
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def both_paths(monkeypatch, inputs, ops, operands, params=(), out=None):
    """(compiled result, NumPy result) of one program; asserts the compiled loop ran."""
    program = fe.program(tuple(ops), tuple(operands), tuple(params), len(inputs))
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 1 << 60)
    reference = program.run_cpu([x.copy() for x in inputs])
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 0)
    calls = []
    real = je.run
    monkeypatch.setattr(je, "run", lambda *a: calls.append(1) or real(*a))
    compiled = program.run_cpu(inputs, out)
    assert calls, f"{ops} did not take the compiled loop"
    return compiled, reference


WITH_NAN = np.float32([np.nan, -np.inf, np.inf, -0.0, 0.0, 1.5, -2.5, 3.0])

ONE_INPUT = [("Neg", []), ("Abs", []), ("Sqrt", []), ("Reciprocal", []), ("Floor", []),
             ("Ceil", []), ("Relu", []), ("Erf", []), ("Tanh", []), ("Pow", [2.0]),
             ("Pow", [3.0]), ("Pow", [4.0]), ("Clip", [-0.5, 0.5]),
             ("Clip", [-math.inf, 0.5]), ("Clip", [0.5, -0.5]), ("LeakyRelu", [0.2]),
             ("HardSigmoid", [0.3, 0.4]), ("Sigmoid", [])]


@pytest.mark.parametrize("name, params", ONE_INPUT, ids=lambda v: str(v))
def test_every_one_input_op_gives_the_numpy_bits(monkeypatch, name, params):
    x = np.concatenate([rand(40) * 3, WITH_NAN])
    with np.errstate(all="ignore"):
        got, want = both_paths(monkeypatch, [x], [name], [0], params)
    np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("name", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_every_two_input_op_gives_the_numpy_bits_nan_included(monkeypatch, name):
    x = np.concatenate([rand(40), WITH_NAN, WITH_NAN])
    y = np.concatenate([rand(40), WITH_NAN, WITH_NAN[::-1]])
    with np.errstate(all="ignore"):
        got, want = both_paths(monkeypatch, [x, y], [name], [0, 1])
    np.testing.assert_array_equal(got, want, err_msg=name)


GELU = dict(ops=["Add", "Scalar", "Div", "Erf", "Scalar", "Add", "Mul", "Scalar", "Mul"],
            operands=[0, 1, 2, 3, 4, 5, 6, 2, 7, 8, 9], params=[math.sqrt(2.0), 1.0, 0.5])


def test_bert_bias_gelu_is_bit_for_bit_the_numpy_chain(monkeypatch):
    x, bias = rand(2, 16, 300), rand(300)
    got, want = both_paths(monkeypatch, [x, bias], **GELU)
    np.testing.assert_array_equal(got, want)


LAYOUTS = [  # broadcast patterns the loop nest merges into three axes, and one it cannot
    ((2, 6, 5, 7), (6, 1, 1)),        # batch norm: per channel
    ((2, 6, 5, 7), (7,)),             # bias over the last axis
    ((2, 6, 5, 7), ()),               # a 0-d input
    ((4, 1), (1, 5)),                 # an outer product
    ((3, 1, 5), (3, 4, 1)),           # both inputs broadcast, on different axes
    ((2, 1, 3, 1, 5), (1, 4, 1, 6, 1)),  # five alternating axes: stays in NumPy
]


@pytest.mark.parametrize("a_shape, b_shape", LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_layouts_match_numpy(a_shape, b_shape, dtype):
    a, b = rand(*a_shape, dtype=dtype), rand(*b_shape, dtype=dtype)
    program = fe.program(("Mul", "Add", "Relu"), (0, 1, 2, 0, 3), (), 2)
    got = program.run_cpu([a, b])
    np.testing.assert_array_equal(got, np.maximum(a * b + a, 0))
    assert got.dtype == dtype


def test_layout_merges_axes_that_every_array_steps_through_alike():
    x, scale = np.empty((1, 8, 5, 7)), np.empty((8, 1, 1))
    assert je.layout(x, [x, scale]) == ((1, 8, 35), ((0, 35, 1), (0, 1, 0), (0, 35, 1)))
    band = np.empty((16, 100))[:, 20:60]  # a band of a conv output: rows 100 apart
    assert je.layout(band, [np.empty((16, 1))]) == ((1, 16, 40), ((0, 1, 0), (0, 100, 1)))
    assert je.layout(np.empty((2, 3, 4, 5)), [np.empty((2, 1, 4, 1))]) is None
    assert je.layout(np.empty((4, 6)), [np.empty((6, 4)).T]) is None  # no vector loads


def test_operands_of_the_outputs_shape_take_the_layout_the_general_merge_gives():
    """Contiguous operands of the output's own shape skip the layout key and merge (a new
    sequence length's GELU): the same loop nest as the general path, for every rank."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=rng.integers(1, 5)))
        out = np.empty(shape, np.float32)
        inputs = [np.empty(shape, np.float32) for _ in range(rng.integers(1, 4))]
        if out.size > 1:
            assert je.layout(out, inputs) == je._layout(out, inputs), shape
    shifted = np.empty((4, 9), np.float32)[:, 1:]  # not contiguous: the general path
    assert je.layout(shifted, [np.empty((4, 8), np.float32)]) == \
        je._layout(shifted, [np.empty((4, 8), np.float32)])


def test_strided_output_bands(monkeypatch):
    y = rand(16, 100)
    bias, residual = rand(16, 1), rand(16, 100)
    want = y.copy()
    want[:, 20:60] = np.maximum(y[:, 20:60] + bias + residual[:, 20:60], 0)
    steps = fe.program(("Add", "Add", "Relu"), (0, 1, 3, 2, 4), (), 3).steps
    band = y[:, 20:60]
    assert je.run(steps, [band, bias, residual[:, 20:60]], band, alias=0)
    np.testing.assert_array_equal(y, want)


def test_output_over_its_own_input_and_strided_inputs(monkeypatch):
    x, bias = rand(3, 40, 50), rand(50)
    want = np.maximum(x + bias, 0) * x
    program = dict(ops=["Add", "Relu", "Mul"], operands=[0, 1, 2, 3, 0])
    inplace = x.copy()
    got, reference = both_paths(monkeypatch, [inplace, bias], out=inplace, **program)
    assert got is inplace
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(reference, want)
    transposed = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
    got, _ = both_paths(monkeypatch, [transposed, bias], **program)
    np.testing.assert_array_equal(got, want)


def test_threads_split_rows_without_changing_a_bit(monkeypatch):
    monkeypatch.setattr(je.jit_cpu, "native_pool", lambda: None)  # Python threads
    x, scale, shift = rand(1, 64, 56, 56), rand(64, 1, 1), rand(64, 1, 1)
    program = fe.program(("Div", "Add", "Relu"), (0, 1, 3, 2, 4), (), 3)  # Div: heavy
    parts = []
    real = je.thread_parts
    monkeypatch.setattr(je, "thread_parts", lambda rows, size: parts.append(real(rows, size))
                        or parts[-1])
    monkeypatch.setattr(parallel, "intra_op_threads", lambda: 2)
    two = program.run_cpu([x, scale, shift])
    assert len(parts[-1]) == 2
    monkeypatch.setattr(parallel, "intra_op_threads", lambda: 1)
    one = program.run_cpu([x, scale, shift])
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(one, np.maximum(x / scale + shift, 0))


def test_one_long_row_is_cut_into_rows_the_threads_share(monkeypatch):
    """Contiguous arrays merge into a single row; a heavy program cuts it into ROWS_OF_ONE
    rows for the threads (EfficientNet's SiLU), with the one-thread bits."""
    monkeypatch.setattr(je.jit_cpu, "native_pool", lambda: None)  # Python threads
    x = rand(1, 32, 112, 112) * 4
    program = fe.program(("Sigmoid", "Mul"), (0, 0, 1), (), 1)
    parts = []
    real = je.thread_parts
    monkeypatch.setattr(je, "thread_parts", lambda rows, size: parts.append(real(rows, size))
                        or parts[-1])
    monkeypatch.setattr(parallel, "intra_op_threads", lambda: 2)
    two = program.run_cpu([x])
    assert len(parts[-1]) == 2 and parts[-1][-1][1] == je.ROWS_OF_ONE
    monkeypatch.setattr(parallel, "intra_op_threads", lambda: 1)
    np.testing.assert_array_equal(two, program.run_cpu([x]))
    assert je._as_rows((1, 1, 7), [(0, 0, 1)]) == ((1, 7, 1), [(0, 1, 1)])
    assert je._as_rows((1, 1, 66), [(0, 0, 1), (0, 0, 0)]) == ((1, 33, 2), [(0, 2, 1), (0, 0, 0)])
    assert je._as_rows((1, 1, 67), [(0, 0, 1)]) == ((1, 1, 67), [(0, 0, 1)])  # a prime


@pytest.mark.parametrize("ops, params, dtype", [
    (["Exp"], [], np.float32),          # NumPy's SIMD exp is ~6x numba's libm call
    (["Tanh"], [], np.float64),         # the float32 rational only
    (["Pow"], [0.7], np.float32),       # only x^2, x^3, x^4 compile
    (["Pow"], [5.0], np.float32),
    (["Erf"], [], np.float64),          # the float32 rational only
    (["Scalar", "Add"], [math.inf], np.float32),  # no literal but finite floats
])
def test_what_does_not_compile_stays_in_numpy(monkeypatch, ops, params, dtype):
    x = rand(10, 10, dtype=dtype)
    monkeypatch.setattr(je, "kernel", lambda text: pytest.fail("compiled " + str(ops)))
    operands = [0] if len(ops) == 1 else [1, 0]
    program = fe.program(tuple(ops), tuple(operands), tuple(params), 1)
    with np.errstate(all="ignore"):
        program.run_cpu([x])


def test_jit_off_and_small_outputs_use_numpy(monkeypatch):
    x = rand(10, 10)
    program = fe.program(("Relu",), (0,), (), 1)
    monkeypatch.setattr(je, "kernel", lambda text: pytest.fail("compiled"))
    monkeypatch.setenv("MIXRT_JIT", "0")
    np.testing.assert_array_equal(program.run_cpu([x]), np.maximum(x, 0))
    monkeypatch.delenv("MIXRT_JIT")
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 101)
    np.testing.assert_array_equal(program.run_cpu([x]), np.maximum(x, 0))


def test_source_holds_only_templates_names_and_float_literals():
    steps = fe.program(("Scalar", "Mul", "LeakyRelu"), (0, 1, 2), (1e-3, 0.25), 1).steps
    text = je.source(steps, 1, np.float32, (True,), None)
    assert "T(0.001)" in text and "T(0.25)" in text
    assert "r1 = T(0.001)" in text and "out[uint64(o + k)] = r3" in text
    assert "v0 = x0[uint64(b0 + k)]" in text
    inplace = je.source(steps, 1, np.float32, (True,), 0)
    assert "b0 = o\n" in inplace and "v0 = out[uint64(b0 + k)]" in inplace
    assert "x0[" not in inplace
    broadcast = je.source(steps, 1, np.float32, (False,), None)
    assert "v0 = x0[uint64(i * x0_0 + j * x0_1)]" in broadcast


def test_generated_module_is_cached_on_disk_and_rewritten_when_edited(tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    steps = fe.program(("Neg", "Abs"), (0, 1), (), 1).steps
    text = je.source(steps, 1, np.float64, (True,), None)
    run = je.kernel(text)
    files = list((tmp_path / "jit").glob("mixrt_fused_*.py"))
    assert len(files) == 1 and files[0].read_text() == text
    x, out = rand(30, dtype=np.float64), np.empty(30)
    run(x, out, 1, 30, 0, 0, 0, 0, 0, 1)
    np.testing.assert_array_equal(out, np.abs(x))
    files[0].write_text("import os  # tampered\n")
    je.kernel_module.cache_clear()
    je.kernel(text)
    assert files[0].read_text() == text


def test_an_unwritable_cache_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(blocker))
    steps = fe.program(("Neg", "Relu"), (0, 1), (), 1).steps
    je.kernel_module.cache_clear()
    run = je.kernel(je.source(steps, 1, np.float64, (True,), None))
    x, out = rand(9, dtype=np.float64), np.empty(9)
    run(x, out, 1, 9, 0, 0, 0, 0, 0, 1)
    np.testing.assert_array_equal(out, np.maximum(-x, 0))


# GPT-2's tanh-form GELU as the TorchScript exporter spells it
GELU_TANH = dict(ops=["Scalar", "Mul", "Pow", "Scalar", "Mul", "Add", "Scalar", "Mul", "Tanh",
                      "Scalar", "Add", "Mul"],
                 operands=[0, 1, 0, 3, 4, 0, 5, 6, 7, 8, 9, 10, 2, 11],
                 params=[0.5, 3.0, 0.044715, 0.7978845608, 1.0])


def test_tanh_gelu_compiles_to_the_numpy_bits_and_stays_near_float64(monkeypatch):
    x = np.concatenate([rand(4000) * 4, np.float32([1e4, -1e4, 60.0, -60.0, 1e-30, -0.0]),
                        WITH_NAN])
    with np.errstate(all="ignore"):
        got, want = both_paths(monkeypatch, [x], **GELU_TANH)
    np.testing.assert_array_equal(got, want)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        exact = 0.5 * x64 * (1 + np.tanh(0.7978845608 * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(got, exact, rtol=2e-6, atol=1e-6)


def test_tanh_and_small_powers_stay_within_float_rounding_of_numpy():
    x = np.concatenate([np.linspace(-12, 12, 20001, dtype=np.float32),
                        np.geomspace(1e-30, 1, 300).astype(np.float32), WITH_NAN])
    tanh = fe.program(("Tanh",), (0,), (), 1).run_cpu([x])
    np.testing.assert_allclose(tanh, np.tanh(x), rtol=8 * 2 ** -24, atol=4e-7)
    assert np.all(np.abs(tanh[np.isfinite(x)]) <= 1)
    for p in (2.0, 3.0, 4.0):  # negative bases included; multiplications, not powf
        got = fe.program(("Pow",), (0,), (p,), 1).run_cpu([x])
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(got, np.power(x, np.float32(p)), rtol=4 * 2 ** -23)


def test_sigmoid_stays_within_its_rationals_rounding_of_the_exact_logistic():
    """FusedElementwise's float32 Sigmoid, a half plus the rational of its odd part (both
    paths), against float64's 1 / (1 + exp(-x)): absolute error ~2e-7, ends exactly 0 and 1,
    NaN kept."""
    x = np.concatenate([np.linspace(-30, 30, 20001, dtype=np.float32), WITH_NAN])
    with np.errstate(all="ignore"):
        got = fe.program(("Sigmoid",), (0,), (), 1).run_cpu([x])
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    finite = np.isfinite(x)
    np.testing.assert_allclose(got[finite], exact[finite], rtol=0, atol=3e-7)
    tail = got[-len(WITH_NAN):]  # NaN, -inf, inf, ...
    assert np.isnan(tail[0]) and tail[1] == 0 and tail[2] == 1


def test_sigmoid_and_silu_give_the_numpy_bits_over_the_whole_range(monkeypatch):
    """Sigmoid, and SiLU (Sigmoid then Mul), compiled and on NumPy's ufuncs: the same bits
    at every float32 from -40 to 40 a few ulp apart, the clip points and their neighbours
    included."""
    edges = np.float32([18.0, -18.0])
    x = np.concatenate([np.linspace(-40, 40, 200001, dtype=np.float32), WITH_NAN, edges,
                        np.nextafter(edges, np.float32(0)), np.nextafter(edges, edges * 2)])
    with np.errstate(all="ignore"):
        for ops, operands in ((["Sigmoid"], [0]), (["Sigmoid", "Mul"], [0, 0, 1])):
            got, want = both_paths(monkeypatch, [x], ops, operands)
            np.testing.assert_array_equal(got, want, err_msg=str(ops))


@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM or jit_cpu.native_pool() is None,
                    reason="the native worker pool runs on Linux x86-64 with AVX-512")
@pytest.mark.parametrize("shape", [(1, 32, 24, 24), (2, 64, 56, 56)])
def test_heavy_programs_split_on_the_native_pool_without_changing_a_bit(monkeypatch, shape):
    """A heavy program from native_parts.SPLIT_ELEMENTS (below the Python threads' reach)
    runs its rows as parts of the native pool, with the one-thread bits, and keeps the call
    as its replay."""
    x = rand(*shape) * 4
    program = fe.program(("Sigmoid", "Mul"), (0, 0, 1), (), 1)
    made = []
    real = je.native_parts.prepared
    monkeypatch.setattr(je.native_parts, "prepared",
                        lambda *args, **kw: made.append(len(args[4])) or real(*args, **kw))
    out, replays = np.empty_like(x), {}
    assert je.run(program.steps, (x,), out, None, {}, replays)
    assert made and made[0] >= 2 and replay.KEY in replays
    monkeypatch.setattr(je.jit_cpu, "native_pool", lambda: None)
    monkeypatch.setattr(parallel, "intra_op_threads", lambda: 1)
    np.testing.assert_array_equal(out, program.run_cpu([x]))


def test_new_layouts_of_a_small_output_reuse_the_generated_code(monkeypatch):
    """A service's new sequence lengths give a program new operand shapes; the generated
    function's text names them through its namespace, so it is compiled once and each new
    layout gives the NumPy chain's bits."""
    program = fe.program(("Mul", "Add", "Relu"), (0, 1, 2, 1, 3), (), 2)
    small_routines._CODES.clear()
    compiled = []
    real_compile = compile
    monkeypatch.setattr(small_routines, "compile",
                        lambda *a: compiled.append(a) or real_compile(*a), raising=False)
    rng = np.random.default_rng(0)
    for rows in (3, 7, 12):
        x = rng.standard_normal((rows, 16)).astype(np.float32)
        b = rng.standard_normal(16).astype(np.float32)
        routine = small_routines.generated(program, np.float32, (x.shape, b.shape), False,
                                           fe.OPS)
        np.testing.assert_array_equal(routine(x, b, None), np.maximum(x * b + b, 0))
    assert len(compiled) == 1


def test_a_layout_the_compiled_loop_takes_generates_no_routine(monkeypatch):
    """A new sequence length's layouts that the compiled loop runs are not generated as
    ufunc routines too (each cost ~0.15 ms and was never called); a small layout still is,
    once, and the large one gives the same bits either way."""
    program = fe.program(("Mul", "Add", "Relu"), (0, 1, 2, 1, 3), (), 2)
    program.routines.clear()  # programs are shared: another test may have met these layouts
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 1 << 12)  # the module runs everything compiled
    generated = []
    real = fe.generated
    monkeypatch.setattr(fe, "generated", lambda *a: generated.append(a[2]) or real(*a))
    rng = np.random.default_rng(1)
    b = rng.standard_normal(16).astype(np.float32)
    large = rng.standard_normal(((1 << 12) // 16 + 1, 16)).astype(np.float32)
    small = rng.standard_normal((2, 16)).astype(np.float32)
    assert je.compilable(program.steps, np.float32)
    assert program.routine([large, b], np.empty_like(large)) is None
    assert generated == []
    for x in (small, small, large):
        np.testing.assert_array_equal(program.run_cpu([x, b], np.empty_like(x)),
                                      np.maximum(x * b + b, 0))
    assert generated.count((small.shape, b.shape)) == 1


def test_a_costly_program_runs_compiled_at_any_size(monkeypatch):
    """A rational (Erf, Tanh, Sigmoid) or a power is tens of ufunc calls a step whatever the
    size, against one compiled call: an MLP's GELU over 46-240 values took ~15-25 us a layer
    as ufunc calls. So no routine is generated for it however small its output, and it
    runs compiled; a cheap program that small still takes its routine."""
    monkeypatch.setattr(je, "JIT_MIN_ELEMENTS", 1 << 12)  # the module runs everything compiled
    costly = fe.program(("Erf", "Mul"), (0, 1, 0), (), 1)
    cheap = fe.program(("Mul", "Add", "Relu"), (0, 1, 2, 1, 3), (), 2)
    assert je.min_elements(costly.steps) == 1
    x = np.random.default_rng(3).standard_normal((2, 30)).astype(np.float32)
    b = np.ones(30, np.float32)
    out = np.empty_like(x)
    assert costly.routine([x], out) is None
    if jit_cpu.enabled() and je.compilable(costly.steps, np.float32):
        assert je.suits(costly.steps, [x], out)
    np.testing.assert_allclose(costly.run_cpu([x], out),
                               np.vectorize(math.erf)(x) * x, rtol=1e-6, atol=1e-7)
    assert cheap.routine([x, b], np.empty_like(x)) is not None
