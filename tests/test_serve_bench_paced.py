"""serve_bench.py's pure parts (no server, no torch): the paced mode's drawn lengths, rhythm
and table, and which servers the throughput benchmark starts and what its table compares."""

import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _serve_paced as serve_bench  # noqa: E402
import serve_bench as throughput  # noqa: E402


def test_drawn_lengths_repeat_under_one_seed_and_stay_in_range():
    lengths = serve_bench.draw_lengths(500, seed=3)
    assert lengths == serve_bench.draw_lengths(500, seed=3)
    assert lengths != serve_bench.draw_lengths(500, seed=4)
    assert min(lengths) == 8 and max(lengths) == 128


def test_drawn_lengths_stop_at_the_models_positions():
    assert max(serve_bench.draw_lengths(200, seed=0, longest=20)) == 20


def test_first_seen_counts_lengths_new_to_the_server():
    assert serve_bench.first_seen([8, 9, 9, 10, 8], seen=[10]) == 2


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_paced_starts_each_call_an_interval_after_the_last_start_without_catching_up():
    clock, starts = FakeClock(), []
    took = [0.002, 0.025, 0.001, 0.001]  # the second call outlasts the 10 ms interval

    def send(index):
        starts.append(clock.now)
        clock.now += took[index]
        return index

    assert serve_bench.paced(send, 4, 0.010, clock, clock.sleep) == [0, 1, 2, 3]
    assert [round(s, 6) for s in starts] == [0.0, 0.010, 0.035, 0.045]


def test_paced_table_gives_mixrt_over_onnxruntime_per_mode():
    def row(runtime, mode, p50, p99):
        return serve_bench.PacedResult("bert_dynseq", runtime, mode, 300, 0, p50, p99, "", "")
    text = serve_bench.paced_table([row("mixrt", "paced 10 ms, fixed 64", 3.0, 9.0),
                                    row("onnxruntime", "paced 10 ms, fixed 64", 2.0, 3.0),
                                    row("mixrt", "paced 10 ms, new lengths", 4.0, 8.0)])
    lines = text.splitlines()
    assert lines[0].startswith("| model | runtime | mode | requests | p50 ms | p99 ms |")
    assert lines[2] == ("| bert_dynseq | mixrt | paced 10 ms, fixed 64 | 300 | 3.0 | 9.0 "
                        "| 1.50x | 3.00x |")
    assert lines[4].endswith("| 4.0 | 8.0 |  |  |")  # no onnxruntime row to compare with


def test_onnxruntime_is_started_with_batching_off_only():
    # KServe's Python model server has no batching: a "batching on" onnxruntime server would
    # be the same unbatched one under another label
    args = Namespace(models=["bert"], runtimes=["mixrt", "onnxruntime"], batching=["on"])
    assert throughput.server_settings(args) == [("bert", "onnxruntime", "off", ""),
                                                ("bert", "mixrt", "on", "")]
    args.batching = ["off", "on"]
    assert [s[1:3] for s in throughput.server_settings(args)] == [
        ("mixrt", "off"), ("onnxruntime", "off"), ("mixrt", "on")]


def test_the_table_compares_mixrt_of_either_setting_with_onnxruntime_unbatched():
    def row(runtime, batching, req_per_s):
        return throughput.Result("bert", runtime, batching, 8, 100, 0, 10.0, req_per_s, 1.0,
                                 2.0, "", "")
    text = throughput.table(throughput._order([row("mixrt", "on", 300.0),
                                               row("onnxruntime", "off", 200.0),
                                               row("mixrt", "off", 250.0)]))
    lines = text.splitlines()
    assert lines[0].endswith("| mixrt / onnxruntime (batching off) req/s |")
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [
        ["mixrt", "off"], ["onnxruntime", "off"], ["mixrt", "on"]]
    assert lines[2].endswith("| 1.25x |") and lines[4].endswith("| 1.50x |")
