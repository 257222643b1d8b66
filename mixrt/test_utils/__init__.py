"""MXNet's testing helpers (``mxnet.test_utils``), for tests written against MXNet 1.x.

Comparisons and their tolerances (``compare.py``), random inputs and scopes
(``inputs.py``), checks that run a symbol or an optimizer (``checks.py``) and statistical
checks of random generators (``generators.py``). Arrays may be NDArrays or NumPy arrays;
comparisons run on the host.

There is no ``__all__`` on purpose: MXNet's tests ``import *`` from this module and use
what it imports as well (``np``, ``mx``, ``array``, ``sys``), as MXNet's module gives them.
"""

import os  # noqa: F401  (the names ``import *`` gives, as MXNet's module gives them)
import sys  # noqa: F401

import numpy as np  # noqa: F401

import mixrt as mx  # noqa: F401
from mixrt.context import Context, current_context  # noqa: F401
from mixrt.nd import NDArray, array  # noqa: F401
from mixrt.sym import Symbol  # noqa: F401
from mixrt.test_utils.checks import (  # noqa: F401
    check_consistency, check_numeric_gradient, check_symbolic_backward,
    check_symbolic_forward, compare_optimizer, numeric_grad, simple_forward)
from mixrt.test_utils.compare import (  # noqa: F401
    almost_equal, assert_almost_equal, assert_exception, compare_ndarray_tuple,
    default_atols, default_context, default_dtype, default_numeric_eps, default_rtols,
    effective_dtype, get_atol, get_rtol, get_tols, np_reduce, same, same_array,
    set_default_context)
from mixrt.test_utils.generators import (  # noqa: F401
    chi_square_check, gen_buckets_probs_with_ppf, verify_generator)
from mixrt.test_utils.inputs import (  # noqa: F401
    discard_stderr, environment, rand_ndarray, rand_shape_2d, rand_shape_3d, rand_shape_nd,
    random_arrays, random_sample, random_uniform_arrays, retry)
from mixrt.util import use_np  # noqa: F401
