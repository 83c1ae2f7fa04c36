# shellcheck shell=bash
# The shell scripts' command lines, sourced by each (scripts/cli.py is the Python scripts' own): --help
# prints the script's usage, which is its leading comment block (after the #! line, up to the first line
# that is not a comment; it starts with "usage: scripts/NAME ..."), and an argument error is one line on
# stderr, exit 2, before the script does anything.

usage() {
    awk 'NR > 1 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$0"
    exit 0
}
# bad_argument MESSAGE: "scripts/NAME: MESSAGE" on stderr, exit 2.
bad_argument() {
    echo "scripts/${0##*/}: $1" >&2
    exit 2
}
unknown_argument() { bad_argument "unknown argument '$1' (--help lists them)"; }
# needs_value "$@" (at an option that takes a value): its value must follow.
needs_value() { [ $# -ge 2 ] || bad_argument "$1 needs a value (--help)"; }
# fp8_gpu: this machine's (first) GPU has FP8 tensor cores, compute capability 8.9 or newer (the one
# owner of that test for the GPU scripts; the trainer's own is fp8_gpu_check); false without a GPU.
fp8_gpu() { nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | awk 'NR == 1 { fp8 = $1 >= 8.9 } END { exit !fp8 }'; }
# no_arguments "$@": a script that takes none answers --help, and refuses anything else.
no_arguments() {
    [ $# -eq 0 ] && return
    case $1 in -h | --help) usage ;; *) unknown_argument "$1" ;; esac
}
