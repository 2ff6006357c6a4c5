#!/bin/bash
# samples/support/checkpoint_resume.sh — a rank killed mid-training, then a restart from the last
# checkpoint, on as many ranks (the weights of an uninterrupted run, bit for bit) and on fewer (its
# accuracy, within noise). ctest runs it as sample.fashion_mnist_mlp.checkpoint_resume:
#
#   checkpoint_resume.sh MPIEXEC SAMPLE WORK_DIR
#
# Steps, each checked:
#   1. an uninterrupted run on 3 ranks: its weights' digest and test accuracy;
#   2. the same run with --checkpoint --every 20 whose rank 1 SIGKILLs itself inside step 90's
#      exchange: the job must fail, after the checkpoint of step 80 was saved;
#   3. --resume on 3 ranks: must start at step 80's position and end with step 1's weights, bitwise;
#   4. --resume on 2 ranks from a copy of step 2's checkpoint: must start there and end within
#      0.03 of step 1's test accuracy.
# Exit: 0 when every check holds, 1 otherwise (saying which), 77 when the data set is missing.
set -u
mpiexec=$1 sample=$2 work=$3
# --fixed-machine: the algorithms chosen on a fixed cost model, not one measured at each run's start
# (under load a measured one may pick another allreduce, which sums in another order).
common=(--algorithm gradient_allreduce --epochs 2 --train-limit 12000 --test-limit 2000 --fixed-machine)
rm -rf "$work" && mkdir -p "$work" || exit 1

fail() {
  echo "FAILED: $*"
  exit 1
}
# run LOG RANKS ARGS...: the sample on RANKS ranks, its output in LOG (and shown); returns its status.
run() {
  local log=$1 n=$2
  shift 2
  echo "+ mpiexec -n $n fashion_mnist_mlp ${common[*]} $*"
  "$mpiexec" -n "$n" "$sample" "${common[@]}" "$@" > "$work/$log" 2>&1
  local status=$?
  cat "$work/$log"
  return $status
}
# field LOG NAME: the value of NAME= on the summary line of LOG.
field() { sed -n "s/^summary .*\b$2=\([^ ]*\).*/\1/p" "$work/$1"; }

run uninterrupted.log 3
status=$?
[ $status -eq 77 ] && exit 77
[ $status -eq 0 ] || fail "the uninterrupted run exited with $status"
weights=$(field uninterrupted.log weights)
accuracy=$(field uninterrupted.log test_accuracy)
[ -n "$weights" ] && [ -n "$accuracy" ] || fail "the uninterrupted run printed no summary"

run killed.log 3 --checkpoint "$work/ckpt" --every 20 --kill-rank 1 --kill-at-step 90 &&
  fail "the run whose rank 1 was killed exited with 0"
grep -q "checkpoint at step 80 " "$work/killed.log" || fail "the killed run did not reach the checkpoint of step 80"
grep -q "rank 1: killing itself" "$work/killed.log" || fail "rank 1 was not the one that died"
[ -f "$work/ckpt/metadata.json" ] || fail "no committed checkpoint in $work/ckpt after the kill"
cp -r "$work/ckpt" "$work/ckpt2"

run resumed3.log 3 --checkpoint "$work/ckpt" --resume || fail "the resumed run on 3 ranks failed"
grep -q "resumed from $work/ckpt (saved by 3 ranks): epoch 2, 3456 examples into it" "$work/resumed3.log" ||
  fail "the run on 3 ranks did not resume at step 80 (epoch 2, 18 of its 62 steps of 3 x 64 examples)"
resumed_weights=$(field resumed3.log weights)
[ "$resumed_weights" = "$weights" ] ||
  fail "resumed on 3 ranks, the weights' digest is $resumed_weights; uninterrupted, $weights"

run resumed2.log 2 --checkpoint "$work/ckpt2" --resume || fail "the resumed run on 2 ranks failed"
grep -q "resumed from $work/ckpt2 (saved by 3 ranks): epoch 2, 3456 examples into it" "$work/resumed2.log" ||
  fail "the run on 2 ranks did not resume at step 80's position"
resumed_accuracy=$(field resumed2.log test_accuracy)
awk -v a="$accuracy" -v b="$resumed_accuracy" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 0.03) }' ||
  fail "resumed on 2 ranks, the test accuracy is $resumed_accuracy; uninterrupted on 3, $accuracy (more than 0.03 apart)"

echo "checkpoint_resume: killed at step 90, resumed from step 80: 3 ranks bitwise ($weights), 2 ranks accuracy" \
  "$resumed_accuracy against $accuracy"
