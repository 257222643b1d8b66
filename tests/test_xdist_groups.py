"""The suite's xdist groups hold: with ``--dist loadgroup`` (pyproject's addopts) every test
marked ``xdist_group`` runs on the worker that runs the rest of its group. The KVStore tests
rely on it (``tests/conftest.py`` groups them: two of them on two workers could be handed the
same free port), the wheel builds (one checkout's ``build/``), and the module-scoped fixtures
whose params are grouped so that each is built once. xdist groups by a suffix it writes into
each test's node id as it collects; a pytest that keeps node ids apart from that field
(pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386), or a mark added after xdist
read them, leaves every test ungrouped, and nothing else fails."""

from __future__ import annotations

import pytest


def _groups_of(item) -> str:
    """The suffix xdist gives ``item``'s node id: its groups' names, sorted, joined by _."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names))


@pytest.mark.xdist_group("probe")
def test_every_grouped_test_carries_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not an xdist worker of a --dist loadgroup run")
    grouped = [(item.nodeid, _groups_of(item)) for item in request.session.items
               if _groups_of(item)]
    ungrouped = [nodeid for nodeid, groups in grouped if not nodeid.endswith(f"@{groups}")]
    assert not ungrouped, f"{len(ungrouped)} of {len(grouped)} grouped tests carry no group, " \
                          f"e.g. {ungrouped[0]}"
    # and the group the conftest adds at collection is there: every KVStore test in it
    kvstore = [item.nodeid for item in request.session.items if "/kvstore/" in item.nodeid]
    outside = [nodeid for nodeid in kvstore if not nodeid.endswith("@sockets")]
    assert not outside, f"{len(outside)} KVStore tests outside the group, e.g. {outside[0]}"
