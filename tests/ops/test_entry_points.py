"""A prepared call through its overload's entry (ops/compiled/entry_points.py): the entry
where an overload was compiled for exactly its arguments' types, the dispatcher where not,
the same answer either way."""

import numpy as np
from numba import njit

from mixrt.ops.compiled.entry_points import fixed_call


@njit(cache=False)
def _add_into(a, b, out):
    for i in range(out.shape[0]):
        out[i] = a[i] + b[i]


def test_a_fixed_call_goes_to_the_overload_of_exactly_its_arguments_types():
    a, b = np.arange(5.0), np.full(5, 2.0)
    out = np.zeros(5)
    _add_into(a, b, out)  # compiled for (float64[::1] x 3)
    call = fixed_call(_add_into, a, b, out)
    assert call.func is not _add_into  # the overload's entry
    out[:] = 0
    call()
    np.testing.assert_array_equal(out, a + b)
    a[:] = 10.0  # the same arrays, new values: read afresh
    call()
    np.testing.assert_array_equal(out, a + b)


def test_arguments_of_types_no_overload_has_go_through_the_dispatcher():
    a, b = np.arange(4.0), np.ones(4)
    out = np.zeros(4)
    _add_into(a, b, out)
    read_only = a.copy()
    read_only.flags.writeable = False  # another numba type: no overload compiled for it yet
    call = fixed_call(_add_into, read_only, b, out)
    assert call.func is _add_into
    call()  # the dispatcher compiles one and answers
    np.testing.assert_array_equal(out, read_only + b)
    strided = np.arange(8.0)[::2]  # an 'A' layout
    fixed_call(_add_into, strided, b, out)()
    np.testing.assert_array_equal(out, strided + b)


def test_a_plain_function_is_called_as_it_is():
    seen = []
    fixed_call(lambda *args: seen.append(args), 1, "two")()
    assert seen == [(1, "two")]


def test_the_entry_kept_by_the_arguments_kinds_is_the_typed_one():
    @njit(cache=False)
    def add_into(a, b, out):  # this test's own: no other compiled its overloads
        for i in range(out.shape[0]):
            out[i] = a[i] + b[i]

    a, b, out = np.arange(3.0), np.ones(3), np.zeros(3)
    add_into(a, b, out)
    first = fixed_call(add_into, a, b, out)
    again = fixed_call(add_into, np.arange(3.0) * 2, b, np.zeros(3))  # same kinds: kept
    assert again.func is first.func is not add_into
    read_only = a.copy()
    read_only.flags.writeable = False
    assert fixed_call(add_into, read_only, b, out).func is add_into  # kinds apart
    add_into(read_only, b, out)  # now compiled for it: the kept None is looked for again
    found = fixed_call(add_into, read_only, b, out)
    assert found.func is not add_into and found.func is not first.func
    found()
    np.testing.assert_array_equal(out, read_only + b)


def test_a_python_int_past_int64_is_typed_by_numba_itself():
    @njit(cache=False)
    def first(x, y):
        return x

    assert first(5, 1) == 5  # compiled for (int64, int64)
    assert fixed_call(first, 5, 1).func is not first
    # uint64 to numba: no overload compiled for it, the dispatcher decides
    assert fixed_call(first, 2 ** 64 - 1, 1).func is first
