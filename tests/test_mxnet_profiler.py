"""mx.profiler's user annotations and options as MXNet 1.9.1 has them: Domain with its Task,
Frame, Counter and Marker, Event, the phases and categories of their trace events (as MXNet
1.9.1 wrote them for the same calls, 2026-11-24), their statistics, dumps' formats and
sorting, and MXNet's extra arguments."""

from __future__ import annotations

import json

import mixrt  # noqa: F401  (before NumPy: mixrt's BLAS policy)
import pytest

from mixrt import nd, profiler
from mixrt.errors import InputError


@pytest.fixture(autouse=True)
def fresh_profiler(tmp_path):
    def reset():
        profiler.set_state("stop")
        profiler.set_config(filename=str(tmp_path / "discarded.json"))
        profiler.dump(finished=True)
    reset()
    yield
    reset()


def test_annotations_write_mxnets_events(tmp_path):
    path = tmp_path / "trace.json"
    profiler.set_config(filename=str(path), profile_all=True, aggregate_stats=True,
                        dump_period=2.0, profile_process="worker")
    profiler.set_state("run")
    domain = profiler.Domain("dom")
    task = domain.new_task("task1")
    task.start()
    (nd.ones((3, 3)) + 1).wait_to_read()
    task.stop()
    frame = domain.new_frame("frame1")
    frame.start()
    frame.stop()
    event = profiler.Event("event1")
    event.start()
    event.stop()
    counter = domain.new_counter("cnt", 5)
    counter += 3
    counter -= 1
    counter.increment(2)
    counter.decrement()
    counter.set_value(10)
    domain.new_marker("mk").mark("process")
    profiler.set_state("stop")
    assert [str(x) for x in (domain, counter, task, event, frame)] == \
        ["dom", "cnt", "task1", "event1", "frame1"]
    profiler.dump()
    events = json.loads(path.read_text())["traceEvents"]
    ours = [(e["name"], e["cat"], e["ph"]) for e in events
            if e["name"] in ("task1", "frame1", "event1", "cnt", "mk")]
    assert ours == [("task1", "dom", "b"), ("task1", "dom", "e"),
                    ("frame1", "dom,frame", "("), ("frame1", "dom,frame", ")"),
                    ("event1", "event", "B"), ("event1", "event", "E")] + \
        [("cnt", "dom", "C")] * 6 + [("mk", "dom,instant_marker", "n")]
    assert [e["args"]["cnt"] for e in events if e["name"] == "cnt"] == [5, 8, 7, 9, 8, 10]
    task_ids = {e["id"] for e in events if e["name"] == "task1"}
    assert len(task_ids) == 1  # a begin and its end pair up by id


def test_statistics_count_tasks_and_sort_as_asked():
    profiler.set_config(aggregate_stats=True)
    profiler.set_state("run")
    task = profiler.Domain("dom").new_task("task1")
    for _ in range(2):
        task.start()
        task.stop()
    event = profiler.Event("event1")
    event.start()
    event.stop()
    profiler.set_state("stop")
    stats = json.loads(profiler.dumps(format="json"))
    assert stats["Unit"] == {"Time": "ms", "Memory": "kB"} and "Memory" in stats
    assert stats["Time"]["dom"]["task1"]["Count"] == 2
    assert stats["Time"]["event"]["event1"]["Count"] == 1
    table = profiler.dumps(sort_by="count", ascending=True)
    assert table.index("event1") < table.index("task1")
    table = profiler.dumps(sort_by="count")
    assert table.index("task1") < table.index("event1")


def test_annotations_record_nothing_while_stopped(tmp_path):
    path = tmp_path / "quiet.json"
    profiler.set_config(filename=str(path))
    task = profiler.Domain("dom").new_task("t")
    task.start()
    task.stop()
    profiler.Marker(profiler.Domain("d"), "m").mark()
    profiler.dump()
    assert json.loads(path.read_text())["traceEvents"] == []


@pytest.mark.parametrize("call,text", [
    (lambda: profiler.set_config(bogus=1), "unknown option"),
    (lambda: profiler.set_config(dump_period=0), "dump_period"),
    (lambda: profiler.set_state("run", profile_process="server"), "'server'"),
    (lambda: profiler.dumps(format="xml"), "format"),
    (lambda: profiler.dumps(sort_by="median"), "sort_by"),
    (lambda: profiler.Task("dom", "t"), "Domain"),
    (lambda: profiler.Domain(""), "non-empty"),
    (lambda: profiler.Event("e").stop(), "stopped before it started"),
    (lambda: profiler.Counter(profiler.Domain("d"), "c").set_value(1.5), "integers"),
    (lambda: profiler.Marker(profiler.Domain("d"), "m").mark("galaxy"), "scope"),
])
def test_bad_arguments_name_what_is_wrong(call, text):
    with pytest.raises(InputError, match=text):
        call()
