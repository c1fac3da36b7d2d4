"""Watches gpu-check's (or gpu-perf's) OUT while it runs: every 10 ms counts
the files under it and parses summary.json and every other *.json there
(perf.json, kernels.json); at STOP's appearance writes RESULT (JSON): the most
files seen at once, every read of a JSON file that was not valid JSON, and how
many distinct summaries were seen.
  python3 sampler.py OUT STOP RESULT"""
import json
import os
import sys
import time

out, stop, result = sys.argv[1:4]
most, invalid, versions, samples = 0, [], set(), 0
while True:
    done = os.path.exists(stop)
    files = [os.path.join(d, f) for d, _, names in os.walk(out) for f in names]
    most = max(most, len(files))
    samples += 1
    try:
        with open(os.path.join(out, "summary.json")) as f:
            text = f.read()
    except OSError:
        text = None
    if text is not None:
        try:
            versions.add(json.dumps(json.loads(text), sort_keys=True))
        except ValueError as e:
            invalid.append(f"summary.json: {e}: {text[:200]!r}")
    for name in os.listdir(out) if os.path.isdir(out) else []:
        if name.endswith(".json") and name != "summary.json" and not name.startswith("."):
            try:
                with open(os.path.join(out, name)) as f:
                    other = f.read()
                json.loads(other)
            except OSError:
                pass  # replaced between the listing and the read
            except ValueError as e:
                invalid.append(f"{name}: {e}: {other[:200]!r}")
    if done:
        break
    time.sleep(0.01)
with open(result, "w") as f:
    json.dump({"most_files": most, "invalid": invalid, "versions": len(versions), "samples": samples}, f)
