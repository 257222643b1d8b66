"""serve_bench.py's paced mode, its pure parts: the drawn lengths, the rhythm, the table (no
server, no torch)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _serve_paced as serve_bench  # noqa: E402


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
