#!/bin/bash
# tests/collective/dead_peer.sh MPIEXEC TEST_DEAD_PEER_MPI OP — runs test_dead_peer_mpi OP on 3
# ranks with FLEXPAR_TIMEOUT=300, and passes when both survivors printed a peer_failure naming rank
# 2 within 3 s.
#
# Launching so that survivors survive (MPICH 4.0.2's hydra, measured): when a rank dies of a signal,
# the launcher SIGKILLs every other rank about 0.3 s later even under -disable-auto-cleanup; under
# -disable-auto-cleanup it leaves them running when a rank *exits*, and sends the others SIGUSR1.
# So each rank runs under a shell that ignores SIGUSR1 and exits 0 once its rank has ended, however
# it ended (doc/failures.md, "Launching").
set -u
mpiexec=$1 exe=$2 op=$3
out=$(FLEXPAR_TIMEOUT=300 "$mpiexec" -disable-auto-cleanup -n 3 bash -c 'trap "" USR1; "$0" "$@"; exit 0' "$exe" "$op" 2>&1)
echo "$out"
for r in 0 1; do
  line=$(grep "^survivor $r: peer_failure after " <<< "$out") || { echo "FAILED: survivor $r named no peer_failure"; exit 1; }
  seconds=$(sed 's/^survivor [0-9]*: peer_failure after \([0-9.]*\) s: .*/\1/' <<< "$line")
  grep -q "rank 2 .*has exited" <<< "$line" || { echo "FAILED: survivor $r did not name rank 2's exit"; exit 1; }
  awk -v s="$seconds" 'BEGIN { exit !(s <= 3) }' || { echo "FAILED: survivor $r took $seconds s (more than 3)"; exit 1; }
done
echo "dead_peer $op: both survivors named rank 2 within 3 s"
