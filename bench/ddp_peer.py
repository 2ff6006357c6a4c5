#!/usr/bin/env python3
"""bench/ddp_peer.py — PyTorch DistributedDataParallel on the tensors of flexpar_engine_bench.

The peer of flexpar_engine_bench (a) and (b), on the same machine in the same run (scripts/engine-bench
runs both): N parameters of S bytes (1024 x 4 KiB), and the same GPT shape (160 tensors, 24.8 M
parameters), each synchronized by DDP over gloo (CPU), next to one bare dist.all_reduce of the same
bytes over the same process group.

A DDP step here is a forward and a backward pass of loss = sum_i (p_i * c_i).sum() (each gradient is
the constant c_i); DDP's sync costs the difference between that step and the same step under
no_sync(), which is what the rows report (its allreduces overlap the rest of the backward pass,
which flexpar_engine_bench's sync-only steps do not grant flexpar). Medians over the steps, slowest
rank; after the timing one more step is checked against the exact sums (exit status 1 if wrong).

  python3 bench/ddp_peer.py [--ranks 2] [-n 1024] [-s 4096] [--steps 30] [--model-steps 10]
                            [--model-width 384 --model-blocks 13] [--only ab]

Needs Debian's python3-torch (with gloo); scripts/engine-bench installs it when missing.
"""
import argparse
import os
import socket
import statistics
import sys
import time


def gpt_counts(width, blocks, vocab=4096, positions=512):
    """The tensor sizes of flexpar_engine_bench's gpt(): embeddings first, then each block."""
    w = width
    counts = [vocab * w, positions * w]
    for _ in range(blocks):
        counts += [w, w, w * 3 * w, 3 * w, w * w, w, w, w, w * 4 * w, 4 * w, 4 * w * w, w]
    return counts + [w, w]


def slowest_median(samples, dist, torch):
    mine = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine[0])


def timed(steps, fn, dist, torch):
    samples = []
    for i in range(steps + 3):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if i >= 3:
            samples.append((time.perf_counter() - start) * 1e6)
    return slowest_median(samples, dist, torch)


def run_rows(rank, size, counts, steps, torch, dist):
    """DDP's sync (default, and gradient_as_bucket_view) and the bare allreduce, for `counts`."""

    class model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(c)) for c in counts])

        def forward(self, constants):
            return sum((p * c).sum() for p, c in zip(self.p, constants))

    # the gradient of p_t[i] on rank r: (r + 1) * ((t + i) % 5 + 1), as flexpar_engine_bench's; their
    # sum over the ranks is ((t + i) % 5 + 1) * size * (size + 1) / 2, and DDP's average that / size
    base = [((t + torch.arange(c, dtype=torch.int64)) % 5 + 1).to(torch.float32) for t, c in enumerate(counts)]
    constants = [b * (rank + 1) for b in base]
    exact = size & (size - 1) == 0  # the average of small integers is exact for a power of two
    results = {}
    wrong = 0
    for view in (False, True):
        ddp = torch.nn.parallel.DistributedDataParallel(model(), gradient_as_bucket_view=view)

        def step(sync=True):
            ddp.zero_grad(set_to_none=False)
            if sync:
                ddp(constants).backward()
            else:
                with ddp.no_sync():
                    ddp(constants).backward()

        with_sync = timed(steps, lambda: step(True), dist, torch)
        local = timed(steps, lambda: step(False), dist, torch)
        results["view" if view else "default"] = (with_sync, local)
        step(True)  # DDP averages: the gradient is the sum / size
        if exact:
            for p, b in zip(ddp.module.p, base):
                wrong += int((p.grad * size != b * (size * (size + 1) // 2)).sum())
        del ddp
    flat = torch.ones(sum(counts))
    bare = timed(steps, lambda: dist.all_reduce(flat), dist, torch)
    w = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(w)
    return results, bare, int(w[0])


def worker(rank, args, port):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one thread per rank, as flexpar's ranks
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    size = args.ranks
    wrong = 0
    lines = []
    if "a" in args.only:
        counts = [args.bytes // 4] * args.tensors
        results, bare, bad = run_rows(rank, size, counts, args.steps, torch, dist)
        wrong += bad
        lines.append(f"# (a) {args.tensors} parameters x {args.bytes} bytes; bare = one dist.all_reduce of all "
                     f"{bare:.1f} us (gloo)")
        lines += table("a", results, bare)
    if "b" in args.only:
        counts = gpt_counts(args.model_width, args.model_blocks)
        results, bare, bad = run_rows(rank, size, counts, args.model_steps, torch, dist)
        wrong += bad
        lines.append(f"# (b) a GPT of {len(counts)} tensors, {sum(counts) / 1e6:.2f} M parameters; bare = one "
                     f"dist.all_reduce of all {bare:.1f} us (gloo)")
        lines += table("b", results, bare)
    if rank == 0:
        print(f"# ddp_peer: torch {torch.__version__}, {size} ranks over gloo, median step of the slowest rank")
        print("\n".join(lines))
        print(f"# verified: one more step of each DDP against the exact sums, {wrong} wrong")
    dist.destroy_process_group()
    if wrong:
        sys.exit(1)


def table(section, results, bare):
    out = [f"{'#':<50} {'step(us)':>12} {'-local(us)':>12} {'sync/bare':>10}"]
    for key, what in (("default", "DDP"), ("view", "DDP, gradient_as_bucket_view")):
        with_sync, local = results[key]
        out.append(f"{what:<50} {with_sync:12.1f} {with_sync - local:12.1f} {(with_sync - local) / bare:9.2f}x")
    for key in ("default", "view"):
        with_sync, local = results[key]
        out.append(f"# row ddp.{section}.{key} step_us={with_sync - local:.1f} bare_us={bare:.1f}")
    out.append(f"# row ddp.{section}.bare step_us={bare:.1f} bare_us={bare:.1f}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("-n", "--tensors", type=int, default=1024)
    parser.add_argument("-s", "--bytes", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model-steps", type=int, default=10)
    parser.add_argument("--model-width", type=int, default=384)
    parser.add_argument("--model-blocks", type=int, default=13)
    parser.add_argument("--only", default="ab")
    args = parser.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print("ddp_peer: PyTorch is not installed (Debian: apt-get install python3-torch)", file=sys.stderr)
        return 77
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(worker, args=(args, port), nprocs=args.ranks, join=True)
    except Exception as e:  # a rank's failure (wrong results: exit status 1)
        print(f"ddp_peer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
