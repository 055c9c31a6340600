#!/usr/bin/env python3
"""Paired A/B of `fence run R -- true` on the directory store, for builds of fence.

    benches/ab.py RUNS FENCE [FENCE...]

Each FENCE binary gets a store of its own in a temporary directory, grown by 500 runs first
(a grant reads the log's tail: a store in use, not an empty one). Then RUNS rounds, each
running every binary once and `flock FILE true` once, in turn, so that the machine's drift
falls on all of them alike; 20 more rounds first, not counted. Prints each one's median (ms),
the median of its paired differences with the first binary, and its ratio to `flock`'s
median (issue 37's target: 2.0x). Wall clock from this process's spawn to its wait.
"""
import os
import shutil
import statistics
import sys
import tempfile
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    runs, binaries = int(sys.argv[1]), sys.argv[2:]
    scratch = tempfile.mkdtemp(prefix="fence-ab-")
    commands = []
    for i, binary in enumerate(binaries):
        binary = os.path.abspath(binary)
        argv = [binary, "--store", f"file://{scratch}/store-{i}", "run", "r", "--", "true"]
        for _ in range(500):
            wait(argv)
        commands.append((f"{i}:{binary}", argv))
    lock = os.path.join(scratch, "flock")
    open(lock, "w").close()
    flock = ["/usr/bin/flock", lock, "/usr/bin/true"]
    commands.append(("flock", flock))
    times = {name: [] for name, _ in commands}
    for round_ in range(runs + 20):
        for name, argv in commands:
            took = wait(argv)
            if round_ >= 20:
                times[name].append(took)
    first = commands[0][0]
    floor = statistics.median(times["flock"])
    for name, _ in commands:
        median = statistics.median(times[name])
        paired = statistics.median(a - b for a, b in zip(times[name], times[first]))
        print(f"{name}: median {median:.3f} ms, paired difference {paired:+.3f} ms, "
              f"{median / floor:.2f}x flock")
    shutil.rmtree(scratch)


def wait(argv):
    """Runs argv to its end (output discarded); the milliseconds it took."""
    with open(os.devnull, "wb") as null:
        start = time.perf_counter_ns()
        pid = os.posix_spawn(argv[0], argv, os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, null.fileno(), 2)])
        os.waitpid(pid, 0)
        return (time.perf_counter_ns() - start) / 1e6


if __name__ == "__main__":
    main()
