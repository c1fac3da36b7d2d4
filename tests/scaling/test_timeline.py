"""Bookkeeping of DDP's per-bucket timestamps (benchmarks/scaling/timeline.py)
on synthetic timings computed by hand."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scaling"))
import timeline as tl  # noqa: E402


def step(**overrides):
    # Backward runs 10 -> 50 ms; every bucket reduced at 60 ms.
    # Bucket 0: started 21, done 30 (9 ms, all before backward ends).
    # Bucket 1: no start stamp: it starts at max(launched 45, bucket 0 done 30) = 45, done 58:
    #   13 ms, 5 of them before backward ends.
    s = {"step_ms": 70.0, "forward_ms": 10.0, "backward_start_ms": 10.0, "backward_end_ms": 50.0,
         "reduced_ms": 60.0, "optimizer_ms": 10.0,
         "buckets": [{"bytes": 100, "ready_ms": 20.0, "launched_ms": 20.0, "started_ms": 21.0, "done_ms": 30.0},
                     {"bytes": 100, "ready_ms": 45.0, "launched_ms": 45.0, "started_ms": None, "done_ms": 58.0}]}
    s.update(overrides)
    return s


class Communication(unittest.TestCase):
    def test_hand_computed(self):
        c = tl.communication(step())
        self.assertAlmostEqual(c["comm_ms"], 22.0)
        self.assertAlmostEqual(c["hidden_ms"], 14.0)
        self.assertAlmostEqual(c["hidden_share"], 14 / 22)
        self.assertAlmostEqual(c["exposed_ms"], 10.0)

    def test_a_missing_start_waits_for_the_previous_bucket(self):
        s = step()
        s["buckets"][1]["launched_ms"] = 25.0  # launched while bucket 0 was still running (until 30)
        self.assertEqual(tl.bucket_intervals(s), [(21.0, 30.0), (30.0, 58.0)])

    def test_blocking_collectives_are_all_exposed(self):
        # On the compute thread (shm), the same 22 ms delayed backward: none hidden, all exposed.
        c = tl.communication(step(), blocking=True)
        self.assertAlmostEqual(c["comm_ms"], 22.0)
        self.assertEqual(c["hidden_share"], 0.0)
        self.assertAlmostEqual(c["exposed_ms"], 22.0)
        self.assertAlmostEqual(tl.summarize_steps([step()], blocking=True)["exposed_comm_ms"], 22.0)

    def test_world_one_has_no_communication(self):
        s = step(buckets=[{"bytes": 100, "ready_ms": 49.0, "launched_ms": 49.0, "started_ms": None, "done_ms": None}],
                 reduced_ms=50.0)
        c = tl.communication(s)
        self.assertEqual(c["comm_ms"], 0)
        self.assertIsNone(c["hidden_share"])
        self.assertEqual(c["exposed_ms"], 0)

    def test_summary_is_the_median_over_steps(self):
        steps = [step(step_ms=70.0), step(step_ms=90.0), step(step_ms=80.0, backward_end_ms=60.0)]
        s = tl.summarize_steps(steps)
        self.assertEqual(s["step_ms"], 80.0)
        self.assertEqual(s["backward_ms"], 40.0)
        # Step 3 hides 9 + 13 of 22 ms; the others 14 of 22: the median share is 14/22.
        self.assertAlmostEqual(s["hidden_share"], 14 / 22)


class Ranks(unittest.TestCase):
    def test_merge_takes_the_straggler_and_the_slowest_step(self):
        fast = step(step_ms=71.0, backward_end_ms=40.0)
        slow = step(step_ms=70.5, backward_end_ms=57.0)
        merged = tl.merge_ranks([[fast], [slow]])
        self.assertEqual(len(merged), 1)
        self.assertEqual(merged[0]["backward_end_ms"], 57.0)
        self.assertEqual(merged[0]["step_ms"], 71.0)

    def test_block_overhead(self):
        # Block 0: DDP median 102 against bare 100 (+2%); block 1: 204 against 200 (+2%):
        # the machine slowed down between blocks, the per-block ratio does not.
        ddp = [{"block": 0, "step_ms": v} for v in (101, 102, 103)] + [{"block": 1, "step_ms": v} for v in (204, 204)]
        bare = [{"block": 0, "step_ms": v} for v in (100, 100, 99)] + [{"block": 1, "step_ms": v} for v in (200, 201, 199)]
        o = tl.block_overhead(ddp, bare)
        self.assertAlmostEqual(o["overhead"], 0.02)
        self.assertEqual(o["blocks"], 2)


if __name__ == "__main__":
    unittest.main()
