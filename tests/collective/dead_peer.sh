#!/bin/bash
# tests/collective/dead_peer.sh MPIEXEC TEST_DEAD_PEER_MPI OP [shrink|noshrink [VICTIM]] — runs
# test_dead_peer_mpi OP on 3 ranks with FLEXPAR_TIMEOUT=300, VICTIM (default 2) dying, and passes when
# both survivors printed a peer_failure that names the victim, and no other rank, as failed within 3 s
# (its exit; for OP=stopped, its silence); with `shrink`, when both then printed that they went on as
# a communicator of 2 ranks.
#
# Launching so that survivors survive (MPICH 4.0.2's hydra, measured): when a rank dies of a signal,
# the launcher SIGKILLs every other rank about 0.3 s later even under -disable-auto-cleanup; under
# -disable-auto-cleanup it leaves them running when a rank *exits*, and sends the others SIGUSR1.
# So each rank runs under a shell that ignores SIGUSR1 and exits 0 once its rank has ended, however
# it ended (doc/failures.md, "Launching").
set -u
mpiexec=$1 exe=$2 op=$3 shrink=${4:-noshrink} victim=${5:-2}
out=$(FLEXPAR_TIMEOUT=300 "$mpiexec" -disable-auto-cleanup -n 3 bash -c 'trap "" USR1; "$0" "$@"; exit 0' "$exe" "$op" \
  "$shrink" "$victim" 2>&1)
echo "$out"
[[ $shrink == shrink ]] || shrink=
if [[ $op == stopped ]]; then why="rank $victim failed: \(no heartbeat for\|its heartbeats stopped\)"; else why="rank $victim .*\(has exited\|publishing\)"; fi
for r in 0 1 2; do
  [[ $r == "$victim" ]] && continue
  line=$(grep "^survivor $r: peer_failure after " <<< "$out") || { echo "FAILED: survivor $r named no peer_failure"; exit 1; }
  seconds=$(sed 's/^survivor [0-9]*: peer_failure after \([0-9.]*\) s: .*/\1/' <<< "$line")
  grep -q "$why" <<< "$line" || { echo "FAILED: survivor $r did not say why rank $victim failed ('$why')"; exit 1; }
  if grep -q "rank [^$victim] failed" <<< "$line"; then echo "FAILED: survivor $r named a survivor failed"; exit 1; fi
  awk -v s="$seconds" 'BEGIN { exit !(s <= 3) }' || { echo "FAILED: survivor $r took $seconds s (more than 3)"; exit 1; }
  if [[ -n $shrink ]]; then
    grep -q "^survivor $r: shrunk to 2 ranks in .*: ok$" <<< "$out" || { echo "FAILED: survivor $r did not go on after shrink"; exit 1; }
  fi
done
echo "dead_peer $op $shrink: both survivors named rank $victim within 3 s${shrink:+ and went on as 2 ranks}"
