"""Session: load a model, bind every node to a kernel, run it.

The call shapes mirror ``onnxruntime.InferenceSession`` (``run(output_names, feeds)``,
``get_inputs()``, ``get_outputs()``) so a service can switch by changing one line; the options
it accepts from there and its ``NodeArg`` are in ``runtime/onnxruntime_surface.py``.

Binding happens once, at construction (``runtime/binding.py``): an unsupported model fails
when it is loaded, naming the node, not halfway through a request. ``run`` checks the feeds
(:class:`~mixrt.runtime.session_feeds.FeedChecks`, this class's base), then walks the
precomputed schedule. What is here is the run machinery: the first run of an input
signature that discovers its memory plan, the planned runs after it (on an arena, in a CUDA
graph, or on the steady lane of a repeated request), and the outputs' delivery.

``runtime/`` never imports ``importers/``: model formats register a loader here
(:func:`register_loader`), and ``mixrt/__init__.py`` registers the ONNX importer.
"""

from __future__ import annotations

import contextlib
import time
from collections import ChainMap
from functools import partial
from typing import Any, Callable

import numpy as np

from mixrt.base import made_up_feeds, placement, run_options
from mixrt.base.errors import ExecutionError, InputError, ModelLoadError, RunTerminated
from mixrt.base.run_options import RunOptions
from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.compiled.worker_wakes import join_form, sizable
from mixrt.ops.elementwise.elementwise import quiet_numpy
from mixrt.runtime.blas_threads import GATE as BLAS_GATE, UNGATED
from mixrt.ops import device_checks
from mixrt.runtime import arenas, collector, kernel_tiers, machine_weights, quiet_time
from mixrt.runtime.binding import bind_graph
from mixrt.runtime.cuda_graph import Captures
from mixrt.ops.device import parse_device
from mixrt.runtime.run_loop import execute
from mixrt.runtime.run_outputs import copied, held_value, host_outputs, host_value
from mixrt.runtime.steady_run import SteadyRun
from mixrt.runtime.arenas import ArenaMemory, acquire, release, trim_idle_calls
from mixrt.runtime.executor import (ExecutionPlan, FrozenValues, host_copies, make_plan,
                                    plannable_on_gpu)
from mixrt.runtime.feeds import feed_elements, feed_signature, signature_form
from mixrt.runtime.inferred_plans import (ShapeProgram, TrustedForm, inference_was_exact,
                                          plan_for_form)
from mixrt.runtime.prepared_forms import prepare_forms, run_missed, run_prepared
from mixrt.runtime.graph import Graph
from mixrt.runtime.onnxruntime_surface import (NodeArg, check_option, check_option_names,
                                               device_choice, node_arg)
from mixrt.runtime.passes.autodiff import expand_gradient_ops
from mixrt.runtime.passes.rewrite import overridable_initializers
from mixrt.runtime.passes.typecheck import check_operand_types
from mixrt.runtime.session_feeds import FeedChecks, feed_key
from mixrt.runtime.support import check_gpu_dtypes
from mixrt.runtime.lru import LruCache
from mixrt.runtime.memory import STRATEGIES, MemoryPlan
from mixrt.runtime.passes import optimize
from mixrt.runtime.passes.infer import infer_types, with_input_shapes
from mixrt.runtime.profiler import Profiler, symbolic_profiler

# input-shape signatures whose plans a session keeps, and the bytes their arenas may hold of
# their own together (arenas.plan_bytes: none on the CPU); older ones are dropped. A service
# sends a new batch or length with nearly every request: with 16 plans at most, batches
# 1..32 of a small model were each a new plan (~0.5 ms) again and again
MAX_CACHED_PLANS = 256
MAX_PLAN_BYTES = 256 << 20
# ... but the last few whatever their arenas hold: a training loop's step and evaluation, or
# its last smaller batch, each with arenas of hundreds of MB, must not plan again each turn
MIN_KEPT_PLANS = 4
# steady lanes a session keeps (SteadyRun), as many as its plans (each dies with its plan):
# a decision tree cycling through 62 batch sizes, 10 ms apart, 0.28 ms a request in a lane,
# 0.48 on the full path (its feed checks alone ~0.1 ms), 2026-11-27
MAX_STEADY_RUNS = MAX_CACHED_PLANS
# plans whose arenas keep their calls (every kept plan since 2026-12-05, 16 before: a shape
# met again after 16 others ran unbound, a 2-layer BERT's new-shape p50 2.9 -> 2.0 ms) and
# arenas on buffers not the session's; the others' let go every TRIM_EVERY new plans
KEEP_CALLS = MAX_CACHED_PLANS
KEEP_BUFFERS = 16
TRIM_EVERY = 8
_NOTHING = contextlib.nullcontext()  # reentrant, so one serves every run

# -- model formats ---------------------------------------------------------------------------

_LOADERS: list[tuple[Callable[[Any], bool], Callable[[Any], Graph]]] = []


def register_loader(accepts: Callable[[Any], bool], load: Callable[[Any], Graph]) -> None:
    """Teach Session a model format: ``accepts(source)`` says whether ``load`` reads it.
    Later registrations are tried first."""
    _LOADERS.insert(0, (accepts, load))


def load_graph(source) -> Graph:
    if isinstance(source, Graph):
        return source
    for accepts, load in _LOADERS:
        if accepts(source):
            return load(source)
    raise ModelLoadError(f"no loader understands {type(source).__name__} {source!r:.80}; "
                         f"expected a path, bytes or an onnx.ModelProto")


# -- the public session ----------------------------------------------------------------------

class Session(FeedChecks):
    """Run a model: ``Session(path | bytes | ModelProto | Graph, device="cpu" | "gpu:0")``.

    ``opt_level`` (0..2) chooses the graph passes (see ``runtime/passes``); ``strategy`` the
    memory planner (``runtime/memory.STRATEGIES``); ``profile=True`` or ``MIXRT_PROFILE=path``
    records a Chrome trace (``end_profiling()`` writes it); without it, runs are recorded by
    ``mixrt.profiler`` while that is running. ``cuda_graph=True`` (GPU sessions) records each
    input signature's planned run as a CUDA graph and replays it (``runtime/cuda_graph.py``).
    A compiled ``.mxr`` model runs as it was compiled. One session serves many threads: each
    concurrent run takes its own arena.
    """

    def __init__(self, model, device: str | None = None, *, opt_level: int = 2,
                 strategy: str = "greedy", profile: bool = False, cuda_graph: bool = False,
                 providers=None, **onnxruntime_options):
        # onnxruntime's ``providers`` choose the device (runtime/providers.py) where
        # ``device`` is not given; its other arguments are checked by onnxruntime_surface
        # (mixrt.onnxruntime maps SessionOptions). Any other name is a typo.
        check_option_names(onnxruntime_options)
        check_option("opt_level", opt_level, (0, 1, 2))
        check_option("strategy", strategy, STRATEGIES)
        self.providers = device_choice(device, providers,
                                       onnxruntime_options.get("provider_options"))
        self.device = parse_device(self.providers.device)
        self.graph = _optimized(load_graph(model), opt_level)
        if self.device.kind == "gpu":
            check_gpu_dtypes(self.graph, self.device)
        self.strategy = strategy
        self._bound = bind_graph(self.graph, self.device)
        self._xp = self.device.xp
        # the inputs a caller must feed, then the initializers it may replace by a feed
        # (listed as inputs too, from IR 4 on: onnxruntime's overridable initializers)
        self._required = self.graph.feed_inputs()
        overridable = overridable_initializers(self.graph, self.graph.metadata.get("ir_version"))
        self._feed_inputs = self._required + [v for v in self.graph.inputs
                                              if v.name in overridable]
        # input-shape signature -> ExecutionPlan
        # feed_key -> SteadyRun: the lanes of the feeds' shapes run lately, once they cannot
        # change (a service's few batch sizes each keep theirs); a plan the cache lets go
        # takes its lanes along (they would hold its arenas past the cache's budget)
        self._steady_runs: dict = {}
        self._plans_made = 0  # plans this session made (every TRIM_EVERY, trim_idle_calls)
        self._settled = False  # wait_compiled's collector.settle taken
        self._row_buckets = None  # a row-wise form's, from wait_compiled (row_buckets.py)
        # the host memory the arenas of all its CPU plans lie on (arenas.ArenaMemory)
        self._arena_memory = ArenaMemory() if self._xp is np else None
        self._plans = LruCache(MAX_CACHED_PLANS, arenas.plan_bytes if self._arena_memory is None
                               else arenas.shared_plan_bytes, MAX_PLAN_BYTES, MIN_KEPT_PLANS,
                               forgotten=partial(_drop_lanes, self._steady_runs))
        self._form_wakes: dict = {}  # form -> worker_wakes.FormWakes
        # forms (feeds' ranks and dtypes) whose new shapes are planned from inference alone,
        # each with what its discovered plan settled (inferred_plans.TrustedForm)
        self._trusted_forms: dict = {}
        self._distrusted_forms: set = set()  # ... and those whose inferred plan failed
        self._shape_program: ShapeProgram | None = None  # their shape inference, made ready
        self._last_plan: tuple | None = None  # (signature, plan) of the last plan found
        # (feed_key, signature, the NumPy text feeds to make str objects of) of checked feeds
        self._known_feeds: tuple | None = None
        self.profiler = Profiler.from_options(profile)
        if cuda_graph and self.device.kind != "gpu":
            raise InputError(f"cuda_graph=True replays CUDA graphs and needs a GPU device; "
                             f"this session runs on {device!r}")
        self._captures = Captures() if cuda_graph else None
        # concurrent CPU runs take one BLAS thread each (runtime/blas_threads.py)
        self._gate = BLAS_GATE if self.device.kind == "cpu" else UNGATED
        # NumPy kernels until the compiled ones are built (runtime/kernel_tiers.py)
        self._tiers = kernel_tiers.tiers_for(self, model, opt_level)

    # -- onnxruntime-compatible surface ----------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return [node_arg(v.name, v.type) for v in self._required]

    def get_outputs(self) -> list[NodeArg]:
        return [node_arg(v.name, v.type) for v in self.graph.outputs]

    def get_providers(self) -> list[str]:
        return list(self.providers.providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {name: dict(options) for name, options in self.providers.options.items()}

    def run(self, output_names, feeds: dict, run_options: RunOptions | None = None) -> list:
        quiet_time.note_run()  # an idle compile child stops (runtime/quiet_time.py)
        if run_options is not None:  # a time limit, or a terminate flag to watch
            return self._limited_run(output_names, feeds, run_options)
        if output_names is None and feeds.__class__ is dict:
            outputs = self._steady(feeds)
            if outputs is None and self._row_buckets is not None:  # a batch past the ladder
                outputs = self._row_buckets.run(feeds, self._all_outputs)
            if outputs is not None:
                return outputs
        return self._run(output_names, feeds, host=True)

    def _steady(self, feeds: dict) -> list | None:
        """The outputs of ``feeds``' steady lane, where they have one (None otherwise)."""
        steady = self._steady_runs.get(feed_key(feeds)) if self._steady_runs else None
        if steady is not None and symbolic_profiler() is None \
                and kernel_tiers._LOADING.get() is None:  # a loading run takes its turn aside
            return self._gate.run(steady.run, feeds)
        return None

    def _all_outputs(self, feeds: dict) -> list:
        outputs = self._steady(feeds)
        return outputs if outputs is not None else self._run(None, feeds, host=True)

    def _limited_run(self, output_names, feeds: dict, options: RunOptions) -> list:
        """:meth:`run` under ``options``' limits (``base/run_options.py``): the run loop and
        the long kernels check them, and a run that reaches one raises RunTerminated naming
        the node; its arena goes back as after any error."""
        try:
            with run_options.limited(options):
                return self.run(output_names, feeds)
        except run_options.Expired as expired:  # before its first node
            raise RunTerminated(f"the run ended before its first node: {expired}") from None

    def run_on_device(self, output_names, feeds: dict, *, lent: bool = False) -> list:
        """As :meth:`run`, but the outputs stay on this session's device (CuPy arrays on a
        GPU): for callers that hand them to the next GPU op (a hybridized block, autograd's
        per-op backward), which a copy to the host and back would only slow down.

        ``lent=True`` hands over outputs that may be this session's own memory (its arena,
        a CUDA graph's buffers) without the copy each would otherwise get: they hold until
        the session's next run, so the caller must be done with them by then, and must not
        run the session from two threads at once (a training step's gradients, which the
        optimizer reads before the next step)."""
        quiet_time.note_run()
        return self._run(output_names, feeds, host=False, lent=lent)

    def read_in_place(self, names) -> None:
        """With ``cuda_graph=True``: the feeds named here are read by a captured graph where
        they are instead of being copied into its input buffers. The caller passes the same
        device array for each on every run and updates it in place between runs (a training
        step's parameters); another array captures the signature again."""
        if self._captures is not None:
            self._captures.read_in_place(names)

    def _run(self, output_names, feeds: dict, host: bool, lent: bool = False) -> list:
        wanted = self._output_names(output_names)
        feeds, signature = self._feeds_and_signature(feeds)
        # without a profiler of its own, the session records into mixrt.profiler's while that
        # runs, its first run of a shape included (a hybridized block's first call counts)
        process = symbolic_profiler() if self.profiler is None else None
        # the kernel tiers' loading run comes from their thread: it takes its turn there,
        # and the gate does not hand the service's later runs to its runner for it
        aside = self._tiers is not None and kernel_tiers._LOADING.get() is self._tiers
        return self._gate.run(self._gated_run, signature, feeds, wanted, process,
                              (host, lent), aside=aside)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until the compiled kernels of every input signature this session has run are
        in use (built in the background: kernel_tiers.py), each form's shape programs made
        meanwhile (prepared_forms.py); True when they are, False on a timeout or where the
        compile failed. Without two tiers (GPU, MIXRT_JIT=0, foreground) it does not wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        prepared = None
        if self._xp is np and self._trusted_forms:  # traced while the child compiles
            self._shape_program, prepared = prepare_forms(
                self._trusted_forms.values(), self._shape_program, self._bound, self.graph,
                self.strategy)
        ready = True if self._tiers is None else self._tiers.wait(timeout)
        if ready and self._xp is np:  # this machine's kernel weights, once (machine_weights.py)
            machine_weights.calibrate_for(self.graph, deadline)
        # on the compiled tier, once its kernels are in (a service's empty caches: not at
        # first); after a timeout or a failed compile they would only take the NumPy tier
        if prepared and ready:  # their plans keep their calls (_kept), the reach's go
            run = lambda feeds: self.run(None, feeds)  # noqa: E731
            buckets = run_prepared(prepared, run, self._run_let_go)
            self._row_buckets = buckets or self._row_buckets
            while self._tiers is not None:  # (twice at most: the sizes whose runs missed)
                ready = self._tiers.wait(None if deadline is None
                                         else max(0.0, deadline - time.monotonic()))
                if not (ready and run_missed(prepared, self._tiers.is_compiled, run)):
                    break
        if ready and not self._settled:  # what being ready made, out of the collector's way
            self._settled = True
            collector.settle(self)
        return ready

    def _run_let_go(self, signature: tuple, feeds: dict) -> tuple[float, list]:
        """``feeds`` (of ``signature``) run twice, their plan then let go, and the arena
        memory it grew with it where that passed REACH_KEEP_BYTES (prepared_forms.run_reach:
        a service never sending such sizes holds little for them, one sending them finds
        its pages touched); returns the second run's seconds and outputs."""
        memory = self._arena_memory
        before = None if memory is None else memory.current
        self.run(None, feeds)
        started = time.perf_counter()
        outputs = self.run(None, feeds)
        took = time.perf_counter() - started
        plan = self._plans.get(signature)
        self._plans.drop(signature)  # its steady lanes with it (_drop_lanes)
        self._last_plan = None
        if plan is not None:
            plan.pool.clear()
        grown = None if memory is None else memory.current
        if grown is not None and grown is not before and grown.buffer.nbytes > REACH_KEEP_BYTES:
            memory.current = before
        return took, outputs

    def _gated_run(self, signature, feeds: dict, wanted, process, delivery: tuple) -> list:
        """Session.run's work, admitted by the BLAS gate (runtime/blas_threads.py);
        ``delivery`` is (to the host, lent) as :meth:`_collect` takes them."""
        if self._tiers is not None and jit_tier.compiled_allowed():
            tier = self._tiers.compiled(signature, feeds)
            if tier is kernel_tiers.LOADING_FIRST:  # compiled at once, if nothing compiles
                outputs = self._tiers.first_run(signature, feeds, lambda: self._gated_run(
                    signature, feeds, wanted, process, delivery))
                plan = self._cached_plan(signature)  # its kernels all loaded: a lane now
                if plan is not None and not plan.unproven:
                    self._remember_steady(signature, plan, delivery[0])
                return outputs
            if not tier:
                with jit_tier.using(False):  # the NumPy tier until the compiled one is in
                    return self._gated_run(signature, feeds, wanted, process, delivery)
        # IEEE results (inf, nan) are what ONNX specifies; NumPy's warnings about them are
        # noise. A GPU session's arena, kernels and streams go to its own GPU, whichever one
        # the calling thread had current.
        on_cpu = self._xp is np
        with quiet_numpy(), _NOTHING if on_cpu else self.device.active(), parallel.pinned():
            plan = self._cached_plan(signature)
            if on_cpu and (plan is None or plan.wakes_workers):
                # the workers, woken, find a CPU of their own (a run too small to wake
                # them does not pay the system calls where its caller moved)
                placement.keep_off_caller()
            # the native workers up by the first kernel, and spinning until the run ends
            with jit_cpu.native_run(on_cpu and (plan is None or plan.wakes_workers),
                                    None if plan is None else plan.wake_choice):
                outputs = self._planned_run(plan, signature, feeds, wanted, process, delivery)
            if on_cpu and jit_cpu.native_job_noted():  # a plan learns to wake them first
                plan = self._cached_plan(signature)
                if plan is not None:
                    plan.wakes_workers = True
            return outputs

    def _planned_run(self, plan, signature, feeds: dict, wanted, process,
                     delivery: tuple) -> list:
        """:meth:`_gated_run` inside its blocks: ``plan`` (None before this signature's
        discovery run) over ``feeds``."""
        on_cpu = self._xp is np
        host, lent = delivery
        if plan is None and on_cpu and process is None:
            plan = self._inferred_plan(signature, feeds)  # a known form: no discovery run
        if plan is None:
            with self._device_checks() as checks:
                env = self._discover(signature, feeds, self.profiler or process)
            self._raise_failed(checks)
            plan = self._cached_plan(signature)
            if plan is None or self.device.kind != "cpu":
                return self._collect(env, wanted, frozenset(), host)
            # on the CPU the answer comes from a planned run too: the discovery run's
            # kernels, called without out= buffers, may take other paths (BERT's
            # LayerNormalization, its products: 2.6e-6 apart), and a session's first
            # answer should have the same bits as every later one. Profilers (the
            # session's own, else the process's) saw the discovery run: each node once
            # for the first call, as they see the planned runs from the next call on.
            profiler = None
        else:
            profiler = self.profiler if self.profiler is not None else process
        if self._captures is not None and profiler is None:
            captured = self._captures.get(signature, plan, self._bound.constants, feeds)
            if captured is not None:
                with captured.lock:  # one replay at a time: they share the graph's memory
                    # (so outputs kept on the device are copies: the next launch writes)
                    values = captured.launch(feeds)
                    if lent:  # valid until the next launch, as the caller agreed
                        return self._collect(values, wanted, frozenset(), host)
                    return captured.kept(lambda: self._collect(values, wanted,
                                                               frozenset(wanted), host))
        # outputs lent out stay arena memory until the caller is done: an arena of its own
        arena = acquire(plan, self._xp, None if lent else self._arena_memory)
        try:
            env = dict(self._bound.constants)
            env.update(plan.frozen)
            env.update(feeds)
            if on_cpu and profiler is None:
                if plan.unproven:  # planned from inference, never run yet
                    return self._first_inferred_run(plan, signature, feeds, env, arena,
                                                    (wanted, process, delivery))
                execute(plan.steps, env, np, arena, plan)
                outputs = self._collect(env, wanted, plan.shared_outputs, host)
                self._remember_steady(signature, plan, host)
                return outputs
            with self._device_checks() as checks:
                if profiler is not None:
                    with profiler.run(plan.arena_bytes, self.device):
                        execute(plan.steps, env, self._xp, arena, plan, profiler)
                else:
                    execute(plan.steps, env, self._xp, arena, plan)
            self._raise_failed(checks)
            return self._collect(env, wanted, frozenset() if lent else plan.shared_outputs,
                                 host)
        finally:
            release(plan, arena)

    def _first_inferred_run(self, plan, signature, feeds: dict, env: dict, arena,
                            request: tuple) -> list:
        """The first run of a plan made from inference (``runtime/inferred_plans.py``).
        Where it fails, inference is not trusted for this form again, and the request is
        answered the way it was before: a discovery run, its plan, a planned run (whose
        error, if the model's own, is the one raised)."""
        wanted, process, (host, _) = request
        try:
            execute(plan.steps, env, np, arena, plan)
        except RunTerminated:  # the run's limit, not inference's error
            raise
        except Exception:  # noqa: BLE001  (answered again, the discovery way)
            form = signature_form(signature)
            trusted = self._trusted_forms.pop(form, None)
            self._distrusted_forms.add(form)
            self._plans.drop(signature)
            self._last_plan = None
            plan.pool.clear()
            try:
                return self._planned_run(None, signature, feeds, wanted, process, request[2])
            except Exception:
                # the discovery run fails too: the request's own error (a sequence longer
                # than the model's positions), not inference's, which stays trusted
                self._distrusted_forms.discard(form)
                if trusted is not None:
                    self._trusted_forms[form] = trusted
                raise
        plan.unproven = False
        outputs = self._collect(env, wanted, plan.shared_outputs, host)
        self._remember_steady(signature, plan, host)
        return outputs

    def _inferred_plan(self, signature: tuple, feeds: dict) -> ExecutionPlan | None:
        """A plan for ``signature`` from shape inference, where a discovery run of its form
        showed inference exact (``runtime/inferred_plans.py``); None otherwise."""
        form = self._trusted_forms.get(signature_form(signature))
        if form is None:
            return None
        if self._shape_program is None:
            self._shape_program = ShapeProgram(self.graph)
        try:  # the burst of objects planning makes dies before a collection (collector.py)
            with collector.held_off():
                plan = plan_for_form(form, signature, feeds, self._shape_program, self._bound,
                                     self.graph.output_names, self.strategy, self.graph.plans)
        except Exception:  # noqa: BLE001  (the discovery run says what is wrong)
            return None
        if plan is None:
            return None
        plan.unproven = True
        plan.wakes_workers = sizable(feeds.values(), self._bound.constants.values(),
                                      plan.slots.values())  # a Slot has its nbytes
        return self._kept(signature, plan)

    def _kept(self, signature: tuple, plan: ExecutionPlan) -> ExecutionPlan:
        """``plan`` kept; every few, the calls of plans not run lately let go (arenas.py)."""
        kept = self._plans.put(signature, plan)
        kept.prepared = kept.prepared or made_up_feeds.in_progress()  # by wait_compiled
        join_form(self._form_wakes, signature_form(signature), kept, feed_elements(signature))
        self._plans_made += 1
        if self._xp is np and self._plans_made % TRIM_EVERY == 0 \
                and len(self._plans) > KEEP_BUFFERS and not kept.prepared:
            trim_idle_calls(self._plans.values(), KEEP_CALLS, self._arena_memory, KEEP_BUFFERS)
        return kept

    def _remember_steady(self, signature, plan, host: bool) -> None:
        """After a planned CPU run: keep what the next run of the same feeds needs, when it
        can take :class:`SteadyRun`'s lane (all outputs, NumPy feeds as they are or text to
        make object strings of, the compiled tier in, no profiler of the session's own)."""
        known = self._known_feeds
        if not host or self.profiler is not None or known is None or known[1] is not signature \
                or not (self._tiers is None or self._tiers.is_compiled(signature)):
            return
        steady = self._steady_runs.get(known[0])
        if steady is None or steady.plan is not plan:
            start = self._bound.constants  # copied by each run, never written
            if plan.frozen:
                start = dict(start)
                start.update(plan.frozen)
            if len(self._steady_runs) >= MAX_STEADY_RUNS:  # the longest-kept goes
                self._steady_runs.pop(next(iter(self._steady_runs)), None)
            self._steady_runs[known[0]] = SteadyRun(known[0], plan, start, partial(
                host_outputs, self.graph.output_names, plan.shared_outputs), known[2],
                self._arena_memory)

    def _device_checks(self):
        """On a GPU, the run's deferred checks (ops/device_checks.py)."""
        if self.device.kind == "gpu":
            return device_checks.collecting()
        return _NOTHING

    def _raise_failed(self, checks) -> None:
        if checks is not None:
            checks.raise_if_failed(self._xp)

    def end_profiling(self) -> str | None:
        """Write the Chrome trace recorded so far; returns its path (None when not profiling)."""
        return None if self.profiler is None else self.profiler.write()

    # -- memory plans ------------------------------------------------------------------------

    def memory_plan(self, feeds: dict | None = None) -> MemoryPlan:
        """The memory plan for these feeds' shapes (for static-shape models, feeds may be
        omitted), made now if this shape signature has not run yet."""
        feeds = self._checked_feeds(feeds if feeds is not None else self._static_feeds())
        signature = feed_signature(feeds)
        plan = self._cached_plan(signature)
        if plan is None:
            # a plan needs no compiled kernel: planning never waits for the compiler
            compiled = self._tiers is None or self._tiers.is_compiled(signature)
            with np.errstate(all="ignore"), self.device.active(), jit_tier.using(compiled):
                self._discover(signature, feeds)
            plan = self._cached_plan(signature)
        return plan.memory

    def _cached_plan(self, signature: tuple) -> ExecutionPlan | None:
        last = self._last_plan  # the same signature object as the last run's: its plan
        if last is not None and last[0] is signature:
            return last[1]
        plan = self._plans.get(signature)
        if plan is not None:
            self._last_plan = (signature, plan)
        return plan

    def _discover(self, signature: tuple, feeds: dict, profiler=None) -> dict:
        """Run once the plain way, then plan the arena for this signature from what it saw."""
        env = ChainMap(dict(feeds), self._bound.constants)
        execute(self._bound.nodes, env, self._xp, profiler=profiler)
        settle = FrozenValues(self._bound.nodes, env.maps[0], self._bound.constants.keys())
        inferred = infer_types(with_input_shapes(self.graph, feeds), settle=settle)
        plan = make_plan(signature, self._bound.nodes, self.graph.output_names, env.maps[0],
                         inferred, settle.values, self.strategy,
                         stored=self.graph.plans,
                         plannable=plannable_on_gpu if self.device.kind == "gpu" else None)
        if self.device.kind == "gpu":
            plan.host_args = host_copies(plan, self._bound.constants)
        else:
            plan.wakes_workers = sizable(env.maps[0].values(), self._bound.constants.values())
            form = signature_form(signature)
            if form not in self._distrusted_forms and inference_was_exact(
                    self._bound.nodes, env.maps[0], inferred, settle.values):
                self._trusted_forms[form] = TrustedForm.of(plan, self._bound.nodes,
                                                           settle.values)
        self._kept(signature, plan)
        return env

    def _collect(self, env, wanted: list[str], shared: frozenset, host: bool) -> list:
        missing = [n for n in wanted if n not in env]
        if missing:
            raise ExecutionError(f"outputs {missing} were not produced by any node")
        # an output that may view arena memory (the next run reuses it) or a frozen value
        # (every run returns it) is copied
        if host and self._xp is np and not shared:
            values = [env[name] for name in wanted]
            if all(value.__class__ is np.ndarray for value in values):
                return values
        if host:
            return [host_value(copied(env[name]) if name in shared else env[name])
                    for name in wanted]
        return [held_value(self.device, copied(env[name]) if name in shared else env[name])
                for name in wanted]

    # -- checks ------------------------------------------------------------------------------

    def _output_names(self, output_names) -> list[str]:
        if output_names is None:
            return self.graph.output_names
        known = set(self.graph.output_names)
        unknown = [n for n in output_names if n not in known]
        if unknown:
            raise InputError(f"requested output(s) {unknown} are not outputs of this model; "
                             f"its outputs are {self.graph.output_names}")
        return list(output_names)

# arena memory a wait's runs at larger sizes may leave grown (Session._run_let_go): the pages
# a service's first larger batch would touch (a small MLP's first 3,961 rows: ~5 ms, 1.2 warm)
REACH_KEEP_BYTES = 32 << 20


# -- planning helpers ------------------------------------------------------------------------

def _drop_lanes(lanes: dict, plan) -> None:
    """The steady lanes of ``plan``, gone with it (the lanes' dict only: a bound method
    of the session would tie it into a cycle, freed by the collector instead of as soon as
    its caller lets it go)."""
    for key, steady in list(lanes.items()):
        if steady.plan is plan:
            lanes.pop(key, None)


def _optimized(graph: Graph, opt_level: int) -> Graph:
    graph.validate()
    # a model the spec calls invalid fails here, naming the node; a .mxr too (its file may
    # have been written by anyone: the optimized graphs mixrt compiles pass)
    check_operand_types(graph)
    if "opt_level" in graph.metadata:  # compiled (.mxr): runs as it was compiled
        return graph
    # ONNX's Gradient op has no kernel: it becomes the backward nodes it stands for
    return optimize(expand_gradient_ops(graph), opt_level)
