#!/usr/bin/env bash
# loomrun's --log_dir / --redirects / --tee / --local_ranks_filter as a user
# types them, with a small shell program as the ranks:
#  1. --log_dir alone: every rank's stdout and stderr in
#     DIR/<rdzv_id>_<random>/attempt_0/<local rank>/{stdout,stderr}.log and on
#     the terminal behind "[rank N]:".
#  2. --redirects 3: the files only, nothing of the ranks on the terminal.
#  3. --tee 1 with --local_ranks_filter: stdout teed for rank 1 only.
#  4. a rank that fails once under --max_restarts=1: a new attempt_1
#     directory, the failed rank named, LOOM_RESUME_REPORT's line repeated.
#  5. bad values exit 2 naming the flag.
# Usage: loomrun_log_dir.sh LOOMRUN
set -u
loomrun=$1
source "$(dirname "$0")/dist_common.sh"
make_work_dir
cat >"$work/rank.sh" <<'SH'
#!/bin/sh
echo "out $RANK attempt $TORCHELASTIC_RESTART_COUNT"
echo "err $RANK" >&2
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && [ -n "${FAIL_ONCE:-}" ]; then exit 3; fi
if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && [ "$RANK" = 0 ] && [ -n "${LOOM_RESUME_REPORT:-}" ]; then
  echo "step 7 (test)" >"$LOOM_RESUME_REPORT"
fi
exit 0
SH
chmod +x "$work/rank.sh"

# The run directory loomrun made under $1 (one).
run_dir() {
  local dirs=("$1"/none_*)
  [[ ${#dirs[@]} -eq 1 && -d ${dirs[0]} ]] || fail "expected one run directory in $1, found: ${dirs[*]}"
  echo "${dirs[0]}"
}
expect_file() {  # FILE TEXT
  [[ -f $1 ]] || fail "$1 is missing"
  [[ $(cat "$1") == "$2" ]] || fail "$1 holds '$(cat "$1")', expected '$2'"
}

# 1. --log_dir alone
"$loomrun" --standalone --nproc_per_node=2 --log_dir "$work/one" "$work/rank.sh" >"$work/1.out" 2>"$work/1.err" ||
  fail "--log_dir run failed: $(cat "$work/1.err")"
run=$(run_dir "$work/one")
for rank in 0 1; do
  expect_file "$run/attempt_0/$rank/stdout.log" "out $rank attempt 0"
  expect_file "$run/attempt_0/$rank/stderr.log" "err $rank"
  grep -qx "\[rank $rank\]:out $rank attempt 0" "$work/1.out" || fail "rank $rank's stdout line is not on the terminal: $(cat "$work/1.out")"
  grep -qx "\[rank $rank\]:err $rank" "$work/1.err" || fail "rank $rank's stderr line is not on the terminal: $(cat "$work/1.err")"
done
grep -q "output goes to $run/attempt_<restart>/<local rank>/" "$work/1.err" || fail "loomrun did not name the run directory"

# 2. --redirects 3: the files only
"$loomrun" --standalone --nproc_per_node=2 --log-dir="$work/two" --redirects=3 "$work/rank.sh" >"$work/2.out" 2>"$work/2.err" ||
  fail "--redirects run failed"
run=$(run_dir "$work/two")
expect_file "$run/attempt_0/1/stdout.log" "out 1 attempt 0"
expect_file "$run/attempt_0/1/stderr.log" "err 1"
[[ ! -s $work/2.out ]] || fail "redirected output reached the terminal: $(cat "$work/2.out")"
if grep -q "err [01]" "$work/2.err"; then fail "redirected stderr reached the terminal: $(cat "$work/2.err")"; fi

# 3. --tee 1 (torchrun's short form -t1) for rank 1's terminal only; without --log_dir the files go under $TMPDIR
TMPDIR=$work/tmp
mkdir -p "$TMPDIR"
TMPDIR=$TMPDIR "$loomrun" --standalone --nproc_per_node=2 -t1 --local_ranks_filter=1 "$work/rank.sh" >"$work/3.out" 2>"$work/3.err" ||
  fail "--tee run failed"
[[ $(cat "$work/3.out") == "[rank 1]:out 1 attempt 0" ]] || fail "--tee 1 --local_ranks_filter=1 showed: $(cat "$work/3.out")"
grep -qx "err 0" "$work/3.err" || fail "rank 0's stderr (not teed) is missing from the terminal"
run=$(run_dir "$TMPDIR")
expect_file "$run/attempt_0/0/stdout.log" "out 0 attempt 0"
[[ ! -e $run/attempt_0/0/stderr.log ]] || fail "stderr was not teed, yet has a file"

# 4. restarts: attempt_1, the failed rank named, the resume line repeated
FAIL_ONCE=1 "$loomrun" --standalone --nproc_per_node=2 --max_restarts=1 --tee=3 --log_dir "$work/four" "$work/rank.sh" \
  >"$work/4.out" 2>"$work/4.err" || fail "the restarted run failed: $(cat "$work/4.err")"
run=$(run_dir "$work/four")
expect_file "$run/attempt_0/1/stdout.log" "out 1 attempt 0"
expect_file "$run/attempt_1/0/stdout.log" "out 0 attempt 1"
expect_file "$run/attempt_1/1/stdout.log" "out 1 attempt 1"
grep -q "loomrun: rank 1 (local rank 1, pid [0-9]*) exited with code 3" "$work/4.err" || fail "the failed rank is not named: $(cat "$work/4.err")"
grep -q "restart 1: the processes resumed from step 7 (test)" "$work/4.err" || fail "the resume report is missing: $(cat "$work/4.err")"
grep -qx "\[rank 0\]:out 0 attempt 1" "$work/4.out" || fail "attempt 1's lines are not on the terminal"

# 5. bad values
expect_usage_error() {  # TEXT ARGS...
  local text=$1
  shift
  "$loomrun" "$@" "$work/rank.sh" >"$work/5.out" 2>"$work/5.err"
  local status=$?
  [[ $status -eq 2 ]] || fail "loomrun $* exited with $status, expected 2"
  grep -qF -- "$text" "$work/5.err" || fail "loomrun $* said '$(cat "$work/5.err")', expected '$text'"
}
expect_usage_error "--tee=4: '4' is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)" --tee 4
expect_usage_error "--redirects=0:1,0:2: local rank 0 is given twice" --redirects=0:1,0:2
expect_usage_error "--redirects=all: 'all' is not 0 (none)" -r all
expect_usage_error "--local_ranks_filter: 'x' is not a whole number" --local_ranks_filter=0,x
expect_usage_error "--log_dir is empty" --log_dir=
touch "$work/a-file"
expect_usage_error "--log_dir=$work/a-file: cannot create it" --log_dir "$work/a-file"
echo "PASS"
