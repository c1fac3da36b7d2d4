"""What the rehearsals' expectations share (expect.py, perf_expect.py): the
failed expectations, each scenario's summary.json, sampler findings, exit
status and wall time, and reading its logs and results.tar.gz. TMP is the
rehearsal's directory (sys.argv[1])."""
import json
import os
import sys
import tarfile

tmp = sys.argv[1]
failures = []


def expect(condition, scenario, what):
    if not condition:
        failures.append(f"{scenario}: {what}")


def load(scenario):
    d = os.path.join(tmp, scenario)
    out = os.path.join(d, "out")
    try:
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        failures.append(f"{scenario}: summary.json is missing or not valid JSON: {e}")
        summary = {"steps": []}
    with open(os.path.join(d, "sampler.json")) as f:
        sampler = json.load(f)
    files = [os.path.join(r, n) for r, _, names in os.walk(out) for n in names]
    expect(sampler["most_files"] <= 8 and len(files) <= 8, scenario,
           f"at most 8 files under OUT (most seen while it ran: {sampler['most_files']}, at the end {len(files)})")
    expect(not sampler["invalid"], scenario, f"the JSON files in OUT valid whenever read, not {sampler['invalid'][:2]}")
    rc = int(open(os.path.join(d, "rc")).read())
    wall = int(open(os.path.join(d, "wall_ms")).read()) / 1000
    status = {s["name"]: s for s in summary["steps"]}
    return summary, status, sampler, rc, wall, d


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def packed(d, name):
    try:
        with tarfile.open(os.path.join(d, "out", "results.tar.gz")) as t:
            return t.extractfile("./" + name).read().decode(errors="replace")
    except (OSError, KeyError, tarfile.TarError, AttributeError) as e:
        return f"<{name} not in results.tar.gz: {e}>"


def statuses(status, expected, scenario):
    for name, want in expected.items():
        got = status.get(name, {}).get("status")
        expect(got == want, scenario, f"step {name} {want}, not {got} ({status.get(name, {}).get('note', '')})")


def report(name):
    """Prints every failed expectation; exits 1 if there was one."""
    for f in failures:
        print("FAILED:", f)
    print(f"{name}: {len(failures)} failed expectations")
    sys.exit(1 if failures else 0)
