#!/usr/bin/env bash
# usage: scripts/build_step.sh LOG TARGET COMMAND...      (the Makefile's, when make test sets BUILD_LOG)
# One target of `make test`'s build, quietly: COMMAND's own output (the compiler's lines) is appended
# to LOG between a line naming TARGET and its command and a line with its exit code, and the screen
# gets one line: the target and its time, or on a failure its last 20 lines and LOG's path. Exits
# with COMMAND's code. `make train_llama3` and the other targets print their commands as usual.
# Example: scripts/build_step.sh build/make_test_build.log train_llama3 nvcc ... -o train_llama3
set -u
. "$(dirname "$0")/cli.sh"
case ${1:-} in -h | --help) usage ;; -*) unknown_argument "$1" ;; esac
[ $# -ge 3 ] || bad_argument "LOG TARGET COMMAND... wanted, $# arguments given (--help)"
log=$1 target=$2
shift 2
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
start=$SECONDS
echo "== $target: $*" > "$out"
"$@" >> "$out" 2>&1
rc=$?
secs=$((SECONDS - start))
lines=$(($(wc -l < "$out") - 1))
echo "-- $target: exit $rc, $secs s" >> "$out"
cat "$out" >> "$log" # (one append per target: the targets that build at once do not mix their lines)
if [ "$rc" -eq 0 ]; then
    echo "build $target ($secs s$([ "$lines" -gt 0 ] && echo ", $lines lines of compiler output in $log"))"
else
    echo "FAILED $target (exit $rc after $secs s); its last lines (all of them in $log):"
    sed '1d;$d' "$out" | tail -n 20 | sed 's/^/    /'
fi
exit "$rc"
