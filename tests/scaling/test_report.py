"""The scaling report's own checks (what the CI quick run relies on): a sound
report passes, each kind of problem is named."""
import copy
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scaling"))
import scaling  # noqa: E402


class ReportChecks(unittest.TestCase):
    def report(self):
        point = {"model": "convnet", "mode": "weak", "world": 1, "step_ms": 60.0, "images_per_s": 1666.7,
                 "epoch_s": 36.0, "forward_ms": 20.0, "backward_ms": 39.0, "optimizer_ms": 1.0, "efficiency": 1.0,
                 "comm_ms": 0.0, "hidden_share": None}
        two = dict(point, world=2, step_ms=64.0, images_per_s=3125.0, efficiency=0.94, comm_ms=0.5, hidden_share=0.2,
                   predicted_step_ms=62.0)
        return {"machine": {}, "config": {}, "load_before": [1.0, 1.0, 1.0], "points": [point, two],
                "ddp_overhead_world1": [{"ddp_step_ms": 60.0, "bare_step_ms": 59.5}],
                "projection": {"clusters": {"x": {"weak_scaling": [{"world": 8, "step_ms": 50.0, "efficiency": 0.99}]}}}}

    def test_a_sound_report_passes(self):
        self.assertEqual(scaling.validate_report(self.report()), [])

    def test_problems_are_named(self):
        r = self.report()
        r["points"][1]["efficiency"] = 1.7
        r["points"][1]["comm_ms"] = 0.0
        r["points"][0]["step_ms"] = -1
        del r["load_before"]
        problems = scaling.validate_report(r)
        self.assertEqual(len(problems), 4, problems)
        self.assertTrue(any("efficiency 1.7" in p for p in problems))
        self.assertTrue(any("missing key load_before" in p for p in problems))

    def test_a_requested_measured_projection_must_be_there_and_sound(self):
        r = self.report()
        r["config"] = {"project_measured": "convnet"}
        self.assertEqual(len(scaling.validate_report(r)), 1)
        r["projection_measured"] = copy.deepcopy(r["projection"])
        self.assertEqual(scaling.validate_report(r), [])
        r["projection_measured"]["clusters"]["x"]["weak_scaling"][0]["efficiency"] = 0
        self.assertEqual(len(scaling.validate_report(r)), 1)

    def test_buckets_must_match_ddp(self):
        r = copy.deepcopy(self.report())
        r["bucket_checks"] = [{"what": "resnet18 cap 5", "ddp": [["fc.bias"]], "model": [["fc.bias", "fc.weight"]]}]
        self.assertEqual(len(scaling.validate_report(r)), 1)



class AllreduceFit(unittest.TestCase):
    @staticmethod
    def measured(milliseconds):
        sizes = [4096, 65536, 1048576, 8388608]
        return [{"backend": "shm", "sizes": [{"bytes": b, "median_ms": t} for b, t in zip(sizes, milliseconds)]}]

    def test_times_that_grow_with_size_give_a_link(self):
        link, entry = scaling.allreduce_fit(self.measured([0.02, 0.04, 0.35, 2.8]), 2)
        self.assertIsNotNone(link)
        self.assertGreater(entry["bus_bandwidth_gbs"], 0)
        self.assertNotIn("fit_error", entry)
        self.assertEqual(len(entry["sizes"]), 4)

    def test_times_a_loaded_machine_scrambled_give_no_link_and_say_why(self):
        # The medians stress-tests.sh's load once gave: 4 KiB slower than 1 MiB.
        link, entry = scaling.allreduce_fit(self.measured([3.63, 0.19, 0.078, 3.9]), 2)
        self.assertIsNone(link)
        self.assertIn("does not grow with size", entry["fit_error"])
        self.assertIn("all-reduce fit: none", "\n".join(scaling.summary_lines(
            {"machine": {"host": "h", "cores": 2, "cpu": "c"}, "load_before": [], "allreduce": entry,
             "ddp_overhead_world1": [], "points": []})))


if __name__ == "__main__":
    unittest.main()
