#!/usr/bin/env bash
# The MLP trained with its gradients averaged through the engine (--sync engine: gradient_sync's
# arena, buckets reduced during the backward pass, the engine's frozen plan from the third step on)
# ends with the weights of the gradient_allreduce relaxation, bit for bit, whatever the bucket size:
# both average the same sums of two ranks' gradients, and SGD updates elementwise. Each run must also
# train (--min-accuracy). Exit 77 when the data set is missing.
#   engine_matches_relaxation.sh MPIEXEC SAMPLE
set -u
mpiexec=$1 sample=$2
common=(--epochs 1 --train-limit 6000 --test-limit 1000 --min-accuracy 0.6)
digest() {
  out=$("$mpiexec" -n 2 "$sample" "${common[@]}" "$@" 2>&1)
  status=$?
  if [ $status -eq 77 ]; then echo "$out"; exit 77; fi
  if [ $status -ne 0 ]; then echo "$out" >&2; echo "FAIL: $* exited $status" >&2; exit 1; fi
  echo "$out" | grep '^summary' >&2
  echo "$out" | sed -n 's/^summary.* weights=\([0-9a-f]*\)$/\1/p'
}
reference=$(digest --algorithm gradient_allreduce) || exit $?
[ -n "$reference" ] || { echo "FAIL: no weights digest from gradient_allreduce"; exit 1; }
failed=0
for run in "--sync engine" "--sync engine --bucket-kib 4" "--sync engine --bucket-kib 100000"; do
  # shellcheck disable=SC2086
  got=$(digest $run) || exit $?
  if [ "$got" = "$reference" ]; then
    echo "ok: $run ends with gradient_allreduce's weights ($got)"
  else
    echo "FAIL: $run ends with weights $got, gradient_allreduce with $reference"
    failed=1
  fi
done
exit $failed
