"""The suite's xdist scheduler: pytest-xdist's ``loadgroup`` with bookkeeping whose cost stays
the same from the first test to the last.

Under ``--dist loadgroup`` every test outside an ``xdist_group`` is a work unit of its own,
and xdist's scheduler (``LoadScopeScheduling``, which ``loadgroup`` extends) keeps every unit
a worker ever ran in that worker's workload, done or not. At each test's end it counts the
workload's pending tests over all of it (pytest-dev/pytest-xdist#279), and it finds a unit's
place in the worker's collection with ``list.index`` (#1212): work that grows with every
test run, quadratic over a run. Over this suite's ~23,000 tests the controlling process took
~60 CPU-seconds, 19-25 with this class (2026-12-01), from the two cores the workers run on.

Here a unit leaves its worker's workload when its last test ends, so the count covers only
what is running, and each worker's collection is indexed once. Which tests run where, and in
what order, is xdist's own: the groups hold as before (``tests/test_xdist_groups.py``).
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling


class GroupScheduling(LoadGroupScheduling):
    """``loadgroup`` whose per-test bookkeeping is the size of what a worker holds."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self._places: dict = {}  # worker -> {node id: its index in that worker's collection}

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        nodeid = self.registered_collections[node][item_index]
        workload = self.assigned_work[node]
        scope = self._split_scope(nodeid)
        workload[scope][nodeid] = True
        if all(workload[scope].values()):
            del workload[scope]  # done: a crash has nothing of it to hand on
        self._reschedule(node)

    def _assign_work_unit(self, node) -> None:
        scope, unit = self.workqueue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = unit
        places = self._places.get(node)
        if places is None:
            collection = self.registered_collections[node]
            places = self._places[node] = {nodeid: i for i, nodeid in enumerate(collection)}
        node.send_runtest_some([places[nodeid] for nodeid, done in unit.items() if not done])
