#!/usr/bin/env bash
# One target of `make test`'s build, quietly: the command's own output (the compiler's lines) is
# appended to LOG between a line naming the target and its command and a line with its exit code,
# and the screen gets one line: the target and its time, or on a failure the target's last lines
# and where the rest is. The Makefile runs each build command through it when BUILD_LOG is set
# (make test sets it); `make train_llama3` and the other targets print their commands as usual.
set -u
usage() {
    cat << 'EOF'
usage: scripts/build_step.sh LOG TARGET COMMAND...
  Runs COMMAND (the build of TARGET) with its output appended to LOG, and prints one line: the
  target and its time, or on a failure its last 20 lines and LOG's path. Exits with COMMAND's code.
EOF
}
case ${1:-} in -h | --help) usage; exit 0 ;; esac
if [ $# -lt 3 ]; then
    echo "error: build_step.sh: LOG TARGET COMMAND... wanted, $# arguments given (--help)" >&2
    exit 2
fi
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
