#!/usr/bin/env python3
"""Summarises one run of a throughput benchmark: loom's JSON line beside its PyTorch peers' (eager
and torch.compile), as ratios, as shares of the machine's f32 GEMM peak measured in the same run,
and with each one's peak RSS. Used by benchmarks/run_resnet50.sh and run_convnet.sh.

    peer_summary.py --label "ResNet-50 cifar stem" --batch 32 --gemm-peak GEMM_JSON \\
        --loom LOOM_JSON --peer EAGER_JSON --peer COMPILED_JSON

Every JSON argument is one line as the benchmark printed it; a peer given as "" (it failed) is
left out. FLOPs per step come from the first peer that counted them (PyTorch's FlopCounterMode:
the nominal forward + backward FLOPs of the model, the same for both frameworks)."""
import argparse, json


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True)
    p.add_argument("--batch", type=int, required=True, help="images per step (per rank)")
    p.add_argument("--gemm-peak", required=True, help="the gemm_peak JSON line at the run's thread count")
    p.add_argument("--loom", required=True)
    p.add_argument("--peer", action="append", default=[])
    p.add_argument("--rate", default="images_per_s", help="the field both sides report their throughput in")
    a = p.parse_args()
    peak_line = json.loads(a.gemm_peak)
    peak = max(peak_line["eigen_gflops"], peak_line["loom_gflops"])
    loom = json.loads(a.loom)
    peers = [json.loads(line) for line in a.peer if line.strip()]
    gflop_per_step = next((q["train_gflop_per_step"] for q in peers if q.get("train_gflop_per_step")), None)

    def row(name, line):
        rate = line.get(a.rate) or line["images_per_s"]
        gflops = gflop_per_step * rate / a.batch if gflop_per_step else None
        return {"who": name, "images_per_s": rate, "gflops": None if gflops is None else round(gflops, 1),
                "share_of_gemm_peak": None if gflops is None else round(gflops / peak, 3),
                "peak_rss_mb": line.get("peak_rss_mb")}

    rows = [row("loom", loom)] + [row(q["peer"], q) for q in peers]
    print(f"{a.label}: f32 GEMM peak {peak:.1f} GFLOP/s at {peak_line['threads']} threads"
          + (f"; {gflop_per_step} GFLOP per training step (PyTorch's FlopCounterMode)" if gflop_per_step else ""))
    print(f"  {'':34} {'images/s':>10} {'GFLOP/s':>8} {'of peak':>8} {'peak RSS MB':>12} {'loom / it':>10}")
    for r in rows:
        ratio = rows[0]["images_per_s"] / r["images_per_s"]
        gflops = "-" if r["gflops"] is None else f"{r['gflops']:.1f}"
        share = "-" if r["share_of_gemm_peak"] is None else f"{100 * r['share_of_gemm_peak']:.0f}%"
        rss = "-" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
        print(f"  {r['who']:34} {r['images_per_s']:>10.1f} {gflops:>8} {share:>8} {rss:>12} {ratio:>10.2f}")
    summary = {"label": a.label, "gemm_peak_gflops": peak, "train_gflop_per_step": gflop_per_step, "rows": rows}
    if peers:
        best = max(rows[1:], key=lambda r: r["images_per_s"])
        summary["ratio_to_best_peer"] = round(rows[0]["images_per_s"] / best["images_per_s"], 3)
        summary["best_peer"] = best["who"]
        print(f"  loom / best peer ({best['who']}): {summary['ratio_to_best_peer']:.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
