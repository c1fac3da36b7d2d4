#!/usr/bin/env bash
# train_mnist's --progress as a user sees it: under a pseudo-terminal (stderr a
# TTY) auto draws the bar in place ('\r', erase to the end of the line, no
# newlines) and clears it; with stderr a file, auto prints plain lines; none
# prints nothing; bar forces the bar. stdout keeps its loss lines throughout.
# Usage: progress_display.sh TRAIN_MNIST
set -u
bin=$1
source "$(dirname "$0")/dist_common.sh"
make_work_dir 600 100
args=(--data "$work/data" --epochs 2 --batch-size 50 --log-interval 4 --threads 1 --checkpoint-dir '')

# run_on_pty OUT ARGS...: the program with stderr on a pseudo-terminal (what it
# wrote there into OUT), stdout into OUT.stdout.
run_on_pty() {
  local out=$1
  shift
  python3 - "$out" "$bin" "$@" <<'PY'
import os, pty, subprocess, sys
out, command = sys.argv[1], sys.argv[2:]
master, slave = pty.openpty()
with open(out + ".stdout", "wb") as stdout:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=slave)
os.close(slave)
data = b""
while True:
    try:
        chunk = os.read(master, 65536)
    except OSError:  # EIO: every writer closed the terminal
        break
    if not chunk:
        break
    data += chunk
status = process.wait(timeout=120)
open(out, "wb").write(data)
sys.exit(status)
PY
}

# 1. auto on a terminal: the bar.
run_on_pty "$work/tty" "${args[@]}" || { cat "$work/tty" "$work/tty.stdout"; fail "train_mnist under a pseudo-terminal failed"; }
python3 - "$work/tty" <<'PY' || fail "the bar on a terminal is not as expected: $(od -c "$work/tty" | head -20)"
import sys
text = open(sys.argv[1], "rb").read().decode()
text = text.replace("\r\n", "\n")  # the terminal's own translation of newlines, if any
assert "\r" in text, "no carriage return: not redrawn in place"
assert "\x1b[K" in text, "no erase-to-end-of-line"
assert "Epoch 1/2" in text and "Epoch 2/2" in text, "the bar does not name the epochs"
assert "img/s" in text and "loss " in text and "data " in text and "<" in text, "bar fields missing"
assert "\n" not in text, "a newline: plain lines on a terminal"
assert text.endswith("\r\x1b[K"), "the bar is not cleared at the end"
print("ok   auto on a terminal: the bar,", text.count("\r") // 2, "redraws")
PY
grep -q '^Epoch \[2/2\], Step \[12/12\]' "$work/tty.stdout" || fail "stdout lost its loss lines under the bar"

# 2. auto with stderr in a file: plain lines, one per --log-interval steps and at the epoch's end.
timeout 120 "$bin" "${args[@]}" >"$work/file.stdout" 2>"$work/file.stderr" || fail "train_mnist with stderr in a file failed"
grep -q $'\r' "$work/file.stderr" && fail "carriage returns in a file: $(cat -A "$work/file.stderr")"
for step in 4 8 12; do
  grep -qE "^Epoch 1/2, step $step/12, [0-9.]+ images/s, loss [0-9.]+, data wait [0-9]+%, ETA [0-9:]+\$" "$work/file.stderr" ||
    fail "no progress line for step $step: $(cat "$work/file.stderr")"
done
[[ $(grep -c '^Epoch ./2, step' "$work/file.stderr") == 6 ]] || fail "expected 6 progress lines: $(cat "$work/file.stderr")"
echo "ok   auto with stderr in a file: $(grep -c '^Epoch' "$work/file.stderr") lines"

# 3. none on a terminal: nothing.
run_on_pty "$work/none" "${args[@]}" --progress none || fail "--progress none failed"
[[ ! -s "$work/none" ]] || fail "--progress none wrote: $(cat -A "$work/none")"
echo "ok   --progress none: nothing on the terminal"

# 4. bar forced into a file; lines forced on a terminal.
timeout 120 "$bin" "${args[@]}" --progress bar >/dev/null 2>"$work/bar.stderr" || fail "--progress bar failed"
grep -q $'\r' "$work/bar.stderr" || fail "--progress bar drew no bar into a file"
run_on_pty "$work/lines" "${args[@]}" --progress lines || fail "--progress lines failed"
sed 's/\r$//' "$work/lines" | grep -q $'\r' && fail "--progress lines redrew in place: $(cat -A "$work/lines")"
[[ $(sed 's/\r$//' "$work/lines" | grep -c '^Epoch ./2, step') == 6 ]] || fail "--progress lines on a terminal: $(cat -A "$work/lines")"
echo "ok   --progress bar into a file and lines on a terminal"
