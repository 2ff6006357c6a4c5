#!/usr/bin/env bash
# fashion_mnist_mlp --on-failure shrink on 3 ranks, rank 2 SIGKILLing itself inside step 20's
# exchange: both survivors must name rank 2 as failed, go on as 2 ranks, finish the epoch, take the
# shards of a 2-rank world (6000 training, 1000 test images each: the dead rank's data is not lost),
# train a second epoch on them and reach --min-accuracy (status 0 each). Exit 77 when the data set is
# missing.
#   shrink_and_go_on.sh MPIEXEC SAMPLE
# Launching so that survivors survive: each rank runs under a shell that ignores hydra's SIGUSR1 and
# exits 0 once its rank has ended (tests/collective/dead_peer.sh says why); so the statuses are
# read from the output, not from mpiexec.
set -u
mpiexec=$1 sample=$2
out=$(OPENBLAS_NUM_THREADS=1 FLEXPAR_TIMEOUT=60 "$mpiexec" -disable-auto-cleanup -n 3 \
  bash -c 'trap "" USR1; "$0" "$@"; echo "rank exit status $?"' "$sample" \
  --algorithm gradient_allreduce --epochs 2 --train-limit 12000 --test-limit 2000 --min-accuracy 0.6 \
  --kill-rank 2 --kill-at-step 20 --on-failure shrink 2>&1)
echo "$out"
if grep -q "rank exit status 77" <<< "$out"; then exit 77; fi
failed=0
for r in 0 1; do
  grep -q "^survivor $r: .*rank 2 .*\(failed\|has exited\).*; went on as rank [01] of 2 after" <<< "$out" ||
    { echo "FAILED: survivor $r did not name rank 2 and go on as one of 2 ranks"; failed=1; }
  grep -q "^rank $r of 2: re-sharded the data for 2 ranks: 6000 training and 1000 test images per rank" <<< "$out" ||
    { echo "FAILED: survivor $r did not take a 2-rank world's shards"; failed=1; }
done
grep -q "^epoch  2/2 " <<< "$out" || { echo "FAILED: no second epoch"; failed=1; }
[ "$(grep -c '^survivor rank [01] of 2: finished, status 0$' <<< "$out")" = 2 ] ||
  { echo "FAILED: not both survivors finished with status 0"; failed=1; }
grep -q "^final test accuracy" <<< "$out" || { echo "FAILED: no final accuracy"; failed=1; }
[ $failed = 0 ] && echo "shrink_and_go_on: rank 2 died at step 20; both survivors named it, shrank to 2 ranks, re-sharded and finished"
exit $failed
