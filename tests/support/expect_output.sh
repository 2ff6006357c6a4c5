#!/usr/bin/env bash
# expect_output.sh [--status zero|nonzero] [--once REGEX]... [--absent REGEX]... -- COMMAND [ARGS...]
#
# Runs COMMAND with stdout and stderr merged, prints what it printed, and fails (exit 1) unless:
#   --status zero|nonzero   its exit status is 0 / not 0 (default: not checked)
#   --once REGEX            exactly one line matches REGEX (extended regex): said once per job, not per rank
#   --absent REGEX          no line matches REGEX
# For the command-line tests of the benchmarks (issue 40: one error line per job, not one per rank).
set -uo pipefail
status="" once=() absent=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --status) status="$2"; shift 2 ;;
    --once) once+=("$2"); shift 2 ;;
    --absent) absent+=("$2"); shift 2 ;;
    *) echo "expect_output.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "${1:-}" == "--" ]] || { echo "expect_output.sh: missing -- COMMAND" >&2; exit 2; }
shift
output=$("$@" 2>&1)
code=$?
printf '%s\n' "$output"
echo "---- exit status $code"
failed=0
if [[ "$status" == zero && $code -ne 0 ]] || [[ "$status" == nonzero && $code -eq 0 ]]; then
  echo "FAILED: exit status $code, expected $status"
  failed=1
fi
for regex in "${once[@]}"; do
  n=$(printf '%s\n' "$output" | grep -cE -- "$regex")
  if [[ $n -ne 1 ]]; then
    echo "FAILED: $n lines match '$regex', expected exactly 1"
    failed=1
  fi
done
for regex in "${absent[@]}"; do
  if printf '%s\n' "$output" | grep -qE -- "$regex"; then
    echo "FAILED: a line matches '$regex'"
    failed=1
  fi
done
exit $failed
