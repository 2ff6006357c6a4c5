#!/usr/bin/env bash
# ZeRO-1, -2 and -3 (prefetching and not, one and two buckets) on two ranks end with the weights of
# data parallelism (--zero 0), bit for bit: with SGD every update is elementwise, and the sums of two
# ranks' gradients do not depend on the order, so sharding may change nothing. Each run must also
# train (--min-accuracy). Then ZeRO-3 with 8-bit weights and gradients (ZeRO++ qwZ + qgZ) over three
# epochs of the whole set must end within 0.5 point of data parallelism's test accuracy.
# Exit 77 when the data set is missing.
#   zero_matches_data_parallel.sh MPIEXEC SAMPLE
set -u
mpiexec=$1 sample=$2
common=(--epochs 1 --train-limit 6000 --test-limit 1000 --min-accuracy 0.6)
run() {
  out=$("$mpiexec" -n 2 "$sample" "$@" 2>&1)
  status=$?
  if [ $status -eq 77 ]; then echo "$out"; exit 77; fi
  if [ $status -ne 0 ]; then echo "$out"; echo "FAIL: $* exited $status" >&2; exit 1; fi
  echo "$out" | grep '^summary' >&2
}
digest() {
  run "${common[@]}" "$@" || exit $?
  echo "$out" | sed -n 's/^summary.* weights=\([0-9a-f]*\)$/\1/p'
}
accuracy() {
  run --epochs 3 "$@" || exit $?
  echo "$out" | sed -n 's/^summary.* test_accuracy=\([0-9.]*\) .*$/\1/p'
}
reference=$(digest --zero 0) || exit $?
[ -n "$reference" ] || { echo "FAIL: no weights digest from --zero 0"; exit 1; }
failed=0
for run in "--zero 1" "--zero 2" "--zero 3" "--zero 3 --bucket-mb 0.8 --prefetch 0" "--zero 3 --bucket-mb 0.8 --no-overlap"; do
  # shellcheck disable=SC2086
  got=$(digest $run) || exit $?
  if [ "$got" = "$reference" ]; then
    echo "ok: $run ends with data parallelism's weights ($got)"
  else
    echo "FAIL: $run ends with weights $got, data parallelism with $reference"
    failed=1
  fi
done
exact=$(accuracy --zero 0) || exit $?
quantized=$(accuracy --zero 3 --quantize both) || exit $?
if awk -v a="$exact" -v b="$quantized" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.005) }'; then
  echo "ok: ZeRO-3 with qwZ + qgZ reaches test accuracy $quantized, data parallelism $exact (within 0.005)"
else
  echo "FAIL: ZeRO-3 with qwZ + qgZ reaches test accuracy '$quantized', data parallelism '$exact' (more than 0.005 apart)"
  failed=1
fi
exit $failed
