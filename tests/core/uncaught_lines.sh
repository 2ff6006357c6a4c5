#!/usr/bin/env bash
# uncaught_lines.sh MPIEXEC DEMO — ranks that fail together with an uncaught flexpar error print it
# once each, whole, on a line of its own: "[rank R] uncaught_demo: ... (end) (uncaught
# flexpar::usage_error)". The launcher may kill the other ranks before they print, so at least one
# such line must be there and every line that holds part of one must be exactly one.
set -u
mpiexec=$1 demo=$2
out=$("$mpiexec" -n 3 "$demo" 2>&1) && { echo "FAILED: the demo exited 0"; exit 1; }
x=$(printf 'x%.0s' $(seq 1500))
whole=0
while IFS= read -r line; do
  [[ "$line" == *uncaught_demo* || "$line" == *xxxxxxxxxx* || "$line" == *"what():"* ]] || continue
  if [[ "$line" =~ ^\[rank\ [0-2]\]\ uncaught_demo:\ every\ rank\ fails\ here:\ ${x}\ \(end\)\ \(uncaught\ flexpar::usage_error\)$ ]]; then
    whole=$((whole + 1))
  else
    echo "FAILED: a line holds part of an error, not one whole error: ${line:0:200}..."
    exit 1
  fi
done <<< "$out"
((whole >= 1)) || { echo "FAILED: no rank printed its error:"; echo "$out" | cut -c1-200; exit 1; }
# an error whose text names no rank gets "[rank R] " in front of it
out=$("$mpiexec" -n 3 "$demo" plain 2>&1) && { echo "FAILED: the plain demo exited 0"; exit 1; }
grep -Eq '^\[rank [0-2]\] uncaught_demo: a plain error \(end\) \(uncaught std::runtime_error\)$' <<< "$out" ||
  { echo "FAILED: a plain error's line lacks its rank:"; echo "$out" | grep "plain error"; exit 1; }
echo "uncaught_lines: $whole whole error line(s), nothing interleaved; a plain error prefixed with its rank"
