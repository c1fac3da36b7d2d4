#!/usr/bin/env bash
# scripts/plot_metrics draws two metrics files (written here by hand in the
# docs/metrics.md format) into one PNG, against the step and against time;
# a file that is not a metrics file is refused with its name. Skipped (77)
# without gnuplot.
# Usage: plot_metrics.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
plot=$here/../../scripts/plot_metrics
source "$here/dist_common.sh"
if ! command -v gnuplot >/dev/null; then
  echo "SKIP: gnuplot is not installed (apt-get install gnuplot-nox)"
  exit 77
fi
make_work_dir
python3 - "$work" <<'PY'
import json, math, sys
for world in (1, 2):
    with open(f"{sys.argv[1]}/world{world}.jsonl", "w") as out:
        out.write(json.dumps({"type": "header", "program": "train_mnist", "world_size": world, "log_interval": 10}) + "\n")
        for epoch in (1, 2):
            for k in range(1, 7):
                step = (epoch - 1) * 60 + 10 * k
                out.write(json.dumps({"type": "step", "epoch": epoch, "epoch_step": 10 * k, "step": step,
                                      "elapsed_s": step * 0.05 / world, "loss": 2.3 * math.exp(-step / 40),
                                      "images_per_s": 2000.0 * world}) + "\n")
            out.write(json.dumps({"type": "epoch", "epoch": epoch, "step": epoch * 60, "elapsed_s": epoch * 3.0 / world,
                                  "test_accuracy": 0.6 + 0.1 * epoch, "images_per_s": 2000.0 * world}) + "\n")
PY
for axis in step time; do
  "$plot" --x "$axis" "$work/world1.jsonl:1 process" "$work/world2.jsonl" -o "$work/$axis.png" >/dev/null ||
    fail "plot_metrics --x $axis failed"
  [[ -s "$work/$axis.png" && $(head -c 8 "$work/$axis.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
    fail "plot_metrics --x $axis wrote no PNG"
  echo "ok   --x $axis: a PNG of $(stat -c %s "$work/$axis.png") bytes from two metrics files"
done
echo '{"type": "header"}' >"$work/empty.jsonl"
err=$("$plot" "$work/empty.jsonl" -o "$work/x.png" 2>&1) && fail "a file without step records was plotted"
[[ "$err" == *"empty.jsonl"* ]] || fail "the error does not name the file: $err"
echo "ok   a file without step records is refused: $err"
