"""The scaling benchmark's cost model against hand computation: ring and
two-level all-reduce times, DDP's bucket assignment, the overlap schedule,
the alpha-beta fit, and projections."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scaling"))
import cost_model as cm  # noqa: E402

US, MS = 1e-6, 1e-3


class RingAllReduce(unittest.TestCase):
    link = cm.Link(alpha_s=10 * US, bandwidth=1e9)  # 10 us per step, 1 GB/s bus bandwidth

    def test_hand_computed_times(self):
        # 2(n-1) alpha + 2(n-1)/n * B / bw with B = 1 MB:
        # n=2: 20 us + 1.0 ms; n=4: 60 us + 1.5 ms; n=8: 140 us + 1.75 ms.
        for n, expected in ((2, 1.020e-3), (4, 1.560e-3), (8, 1.890e-3)):
            self.assertAlmostEqual(cm.ring_allreduce_time(n, 1e6, self.link), expected, places=12, msg=f"n={n}")

    def test_one_rank_and_empty_message_cost_nothing(self):
        self.assertEqual(cm.ring_allreduce_time(1, 1e6, self.link), 0.0)
        self.assertEqual(cm.ring_allreduce_time(4, 0, self.link), 0.0)
        with self.assertRaises(ValueError):
            cm.ring_allreduce_time(0, 1e6, self.link)


class Hierarchical(unittest.TestCase):
    # 4 devices per node: 1 us, 100 GB/s inside; 10 us, 10 GB/s per node between nodes.
    cluster = cm.Cluster(4, cm.Link(1 * US, 100e9), cm.Link(10 * US, 10e9), hierarchical=True)

    def test_inside_one_node_is_the_intra_ring(self):
        # n=4, B=100 MB: 6 us + 2*3/4 * 100e6 / 100e9 = 1.506 ms
        self.assertAlmostEqual(cm.cluster_allreduce_time(4, 100e6, self.cluster), 1.506e-3, places=12)

    def test_four_nodes(self):
        # n=16 = 4 nodes x 4: intra 6 us + 1.5 ms = 1.506 ms;
        # inter 2*3*10 us + 2*3/4 * 100e6 / 10e9 = 60 us + 15 ms = 15.06 ms; total 16.566 ms.
        self.assertAlmostEqual(cm.cluster_allreduce_time(16, 100e6, self.cluster), 16.566e-3, places=12)

    def test_flat_ring_is_paced_by_the_slow_link(self):
        flat = cm.Cluster(4, self.cluster.intra, self.cluster.inter, hierarchical=False)
        # 2*15*10 us + 2*15/16 * 100e6 / 10e9 = 0.3 ms + 18.75 ms
        self.assertAlmostEqual(cm.cluster_allreduce_time(16, 100e6, flat), 19.05e-3, places=12)
        self.assertLess(cm.cluster_allreduce_time(16, 100e6, self.cluster), cm.cluster_allreduce_time(16, 100e6, flat))

    def test_partial_nodes_are_refused(self):
        with self.assertRaises(ValueError):
            cm.cluster_allreduce_time(6, 1e6, self.cluster)


class Fit(unittest.TestCase):
    def test_recovers_alpha_and_bandwidth(self):
        truth = cm.Link(alpha_s=50 * US, bandwidth=2e9)
        samples = [(b, cm.ring_allreduce_time(2, b, truth)) for b in (4096, 65536, 1 << 20, 16 << 20)]
        link, stats = cm.fit_alpha_beta(samples, 2)
        self.assertAlmostEqual(link.alpha_s / truth.alpha_s, 1.0, places=9)
        self.assertAlmostEqual(link.bandwidth / truth.bandwidth, 1.0, places=9)
        self.assertLess(stats["max_abs_relative_error"], 1e-9)

    def test_negative_intercept_is_clamped(self):
        # Times exactly proportional to size minus a little: the intercept would be negative.
        samples = [(1e6, 0.9e-3), (2e6, 2.0e-3), (4e6, 4.1e-3)]
        link, _ = cm.fit_alpha_beta(samples, 4)
        self.assertEqual(link.alpha_s, 0.0)
        self.assertGreater(link.bandwidth, 0)


class Buckets(unittest.TestCase):
    def test_reverse_order_with_first_cap(self):
        # Sizes in registration order; caps: first 5 bytes, then 10.
        # Reverse walk: [4, 3] (2+2), then 8 would pass 5 -> close; [2] (8), then 4 would pass 10 -> close; [1, 0].
        self.assertEqual(cm.assign_buckets([4, 4, 8, 2, 2], 5, 10), [[4, 3], [2], [1, 0]])

    def test_a_parameter_larger_than_the_cap_gets_its_own_bucket(self):
        self.assertEqual(cm.assign_buckets([3, 100, 3], 10, 10), [[2], [1], [0]])

    def test_profile_bucket_is_ready_with_its_last_parameter(self):
        p = cm.Profile(1 * MS, 10 * MS, 0, parameter_bytes=[4, 4, 8, 2, 2],
                       parameter_ready_s=[9 * MS, 8 * MS, 5 * MS, 1 * MS, 2 * MS], batch_per_device=1)
        buckets = p.buckets(5, 10)
        self.assertEqual([b.nbytes for b in buckets], [4, 8, 8])
        self.assertEqual([b.ready_s for b in buckets], [2 * MS, 5 * MS, 9 * MS])


def in_ms(times):
    return [round(t / MS, 9) for t in times]


class Overlap(unittest.TestCase):
    def three_buckets(self, schedule, starts_ms, dones_ms, step_ms):
        """`schedule` of a 10 ms backward whose buckets are ready at 3, 6, 10 ms
        and need 4, 1, 2 ms on the wire; checks the start and end of each
        bucket's all-reduce and the step time with forward 5 and optimizer 1 ms."""
        buckets = [cm.Bucket(3 * MS, 0), cm.Bucket(6 * MS, 0), cm.Bucket(10 * MS, 0)]
        s = schedule(buckets, [4 * MS, 1 * MS, 2 * MS], 10 * MS)
        self.assertEqual(in_ms(s.starts), starts_ms)
        self.assertEqual(in_ms(s.dones), dones_ms)
        self.assertAlmostEqual(cm.step_time(5 * MS, 10 * MS, 1 * MS, s), step_ms * MS, places=12)
        return s

    def test_three_buckets_by_hand(self):
        # Bucket 0: 3 -> 7; bucket 1 waits for bucket 0: 7 -> 8; bucket 2: 10 -> 12.
        # Step = forward 5 + max(10, 12) + optimizer 1 = 18 ms; 2 ms exposed; 5 of 7 ms hidden.
        s = self.three_buckets(cm.overlap_schedule, [3, 7, 10], [7, 8, 12], 18)
        self.assertAlmostEqual(s.exposed_s, 2 * MS, places=12)
        self.assertAlmostEqual(s.hidden_share, 5 / 7, places=12)

    def test_hidden_communication_costs_nothing(self):
        buckets = [cm.Bucket(3 * MS, 0), cm.Bucket(6 * MS, 0), cm.Bucket(9 * MS, 0)]
        s = cm.overlap_schedule(buckets, [1 * MS, 1 * MS, 0.5 * MS], 10 * MS)
        self.assertAlmostEqual(cm.step_time(5 * MS, 10 * MS, 1 * MS, s), 16 * MS, places=12)
        self.assertEqual(s.hidden_share, 1.0)

    def test_buckets_launch_in_order(self):
        # Bucket 1 is ready before bucket 0; it still waits for bucket 0 to finish.
        s = cm.overlap_schedule([cm.Bucket(5 * MS, 0), cm.Bucket(2 * MS, 0)], [1 * MS, 1 * MS], 6 * MS)
        self.assertEqual(in_ms(s.dones), [6, 7])

    def test_blocking_collectives_delay_backward(self):
        # The same buckets, all-reduced on the compute thread: bucket 0 at 3 -> 7, so backward
        # resumes 4 ms late; bucket 1 is ready at 6 + 4 = 10 -> 11; bucket 2 at 10 + 5 = 15 -> 17.
        # Backward ends at 10 + 7 = 17; step = 5 + 17 + 1 = 23 ms; nothing hidden.
        s = self.three_buckets(cm.blocking_schedule, [3, 10, 15], [7, 11, 17], 23)
        self.assertEqual(s.exposed_s, 0)
        self.assertEqual(s.hidden_share, 0.0)


class Projection(unittest.TestCase):
    def profile(self):
        # Two parameters of 1 MB: ready at 4 and 10 ms of a 10 ms backward; forward 5, optimizer 1.
        return cm.Profile(5 * MS, 10 * MS, 1 * MS, parameter_bytes=[1_000_000, 1_000_000],
                          parameter_ready_s=[10 * MS, 4 * MS], batch_per_device=32)

    def test_world_one_is_the_compute(self):
        pred = cm.predict_step(self.profile(), 1, lambda n, b: 1.0)
        self.assertAlmostEqual(pred.step_s, 16 * MS, places=12)
        self.assertEqual(pred.comm_s, 0)

    def test_weak_scaling_by_hand(self):
        link = cm.Link(0, 1e9)  # 1 GB/s, no latency
        ring = lambda n, b: cm.ring_allreduce_time(n, b, link)  # noqa: E731
        # Caps of 1 MB: two buckets. n=2: each 1 ms on the wire. Bucket 0 (ready 4) 4 -> 5, bucket 1 (ready 10) 10 -> 11.
        # Step = 5 + 11 + 1 = 17 ms; efficiency 16/17.
        rows = cm.project(self.profile(), [1, 2], ring, 1_000_000, 1_000_000)
        self.assertAlmostEqual(rows[1]["step_ms"], 17.0, places=9)
        self.assertAlmostEqual(rows[1]["efficiency"], 16 / 17, places=12)
        self.assertAlmostEqual(rows[1]["images_per_s"], 64 / 17e-3, places=6)

    def test_expected_max_by_hand(self):
        # Two draws from {1, 2}: (1,1) (1,2) (2,1) (2,2) -> maxima 1, 2, 2, 2: mean 1.75.
        self.assertAlmostEqual(cm.expected_max([2.0, 1.0], 2), 1.75, places=12)
        # One draw is the mean; three draws from {0, 0, 3}: 1 - (2/3)^3 = 19/27 of them see the 3.
        self.assertAlmostEqual(cm.expected_max([0.0, 0.0, 3.0], 1), 1.0, places=12)
        self.assertAlmostEqual(cm.expected_max([0.0, 0.0, 3.0], 3), 3 * 19 / 27, places=12)

    def test_straggler_adds_the_expected_wait_for_the_slowest_rank(self):
        # Steps of 15 or 17 ms (median 16): the slower of two ranks is 17 ms in 3 of 4 pairs: 16.5, +0.5 ms.
        profile = self.profile()
        profile.step_samples_s = [15 * MS, 17 * MS]
        self.assertAlmostEqual(cm.straggler_s(profile.step_samples_s, 2), 0.5 * MS, places=12)
        self.assertEqual(cm.straggler_s(profile.step_samples_s, 1), 0.0)
        free = lambda n, b: 0.0  # noqa: E731
        self.assertAlmostEqual(cm.predict_step(profile, 2, free).step_s, 16.5 * MS, places=12)
        self.assertAlmostEqual(cm.predict_step(profile, 1, free).step_s, 16 * MS, places=12)
        # Strong scaling halves the batch and the samples with it.
        self.assertAlmostEqual(cm.straggler_s(profile.scaled(16).step_samples_s, 2), 0.25 * MS, places=12)

    def test_strong_scaling_scales_compute_with_the_batch(self):
        link = cm.Link(0, 1e12)
        ring = lambda n, b: cm.ring_allreduce_time(n, b, link)  # noqa: E731
        rows = cm.project(self.profile(), [1, 2], ring, global_batch=64)
        # World 1 at batch 64: compute 5*2 + 10*2 + 1 = 31 ms; world 2 at batch 32: 16 ms + a few us of comm.
        self.assertAlmostEqual(rows[0]["step_ms"], 31.0, places=9)
        self.assertAlmostEqual(rows[1]["step_ms"], 16.0, places=2)
        self.assertAlmostEqual(rows[1]["efficiency"], 31 / 32, places=3)

    def test_best_bucket_cap(self):
        best, rows = cm.best_bucket_cap(self.profile(), 2, lambda n, b: cm.ring_allreduce_time(n, b, cm.Link(0, 1e9)),
                                        caps_mib=(1, 25), first_bucket_bytes_cap=1)
        self.assertEqual(len(rows), 2)
        self.assertEqual(best, min(rows, key=lambda r: r["step_ms"])["bucket_cap_mib"])

    def test_h200_resnet50_assumption_meets_the_goal(self):
        """The shipped H200 ResNet-50 assumption projects >= 95% efficiency on
        8 GPUs over NVLink with DDP's default caps (an assumption, not a measurement)."""
        import json
        path = os.path.join(os.path.dirname(cm.__file__), "profiles", "h200_resnet50_assumed.json")
        with open(path) as f:
            profile = cm.Profile.from_json(json.load(f))
        self.assertEqual(sum(profile.parameter_bytes), 4 * 25_557_032)  # torchvision ResNet-50
        nvlink = cm.PRESETS["nvlink-ib"]
        rows = cm.project(profile, [1, 8], lambda n, b: cm.cluster_allreduce_time(n, b, nvlink))
        self.assertGreaterEqual(rows[1]["efficiency"], 0.95)


if __name__ == "__main__":
    unittest.main()
