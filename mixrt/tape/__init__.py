"""The tape under ``mixrt.autograd``: recording, the backward walk, Python Functions.

This is the floor the array frontend records on (``mixrt.nd`` imports it; it imports no
frontend above it): ``recording.py`` (modes, and what the imperative dispatcher asks),
``nodes.py`` (the nodes and the backward walk), ``opgrad.py`` (an op's compiled backward),
``backward.py`` (``backward``, ``grad``, ``mark_variables``), ``function.py`` (``Function``),
``replay.py`` (a graph run op by op so the tape sees each op). ``mixrt.autograd`` is MXNet's
module over it, with ``get_symbol``, which needs the symbol frontend.
"""

from mixrt.tape.backward import backward, grad, mark_variables  # noqa: F401
from mixrt.tape.function import Function  # noqa: F401
from mixrt.tape.recording import (connect_dispatcher, is_recording, is_training,  # noqa: F401
                                  needs_tape, pause, predict_mode, record, set_recording,
                                  set_training, train_mode)
