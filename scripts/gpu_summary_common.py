"""What the device scripts' summaries (gpu-check-summary.py, gpu-perf-summary.py)
share: reading a step's output that may be missing, and the JSON lines in it."""
import json


def read(path):
    """The file's text ('' when it is missing or unreadable: a step that never ran)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def json_lines(text):
    """Every line of `text` that is a JSON object, parsed; other lines skipped."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows
