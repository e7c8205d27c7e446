"""Summarises `perf report --no-children -n --sort comm,sym --stdio -q` for perf/profile.sh.

Reads lines of "<percent>%  <samples>  <thread name>  [.] <function>" and prints each kind of
thread's share of the samples and the cores it kept busy (samples / frequency / seconds;
request threads numbered by actix and tokio are one kind), then each kind's hottest
functions with their share of the whole process.
"""

import argparse
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S.*?)\s+\[[.k]\]\s+(.*?)\s*$")


def kind_of(thread):
    """Threads that differ only by a number (actix-rt|system:0|1, tokio-runtime-w) are one kind."""
    return re.sub(r"[:\-_ ]?\d+$", "", re.sub(r"\|\d+$", "", thread)) or thread


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--freq", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    shares = defaultdict(float)
    samples = defaultdict(int)
    functions = defaultdict(lambda: defaultdict(float))
    for line in sys.stdin:
        match = LINE.match(line)
        if not match:
            continue
        percent, count = float(match.group(1)), int(match.group(2))
        thread, function = match.group(3), match.group(4)
        kind = kind_of(thread)
        shares[kind] += percent
        samples[kind] += count
        # Monomorphised names differ only in their hash: one row per function.
        functions[kind][re.sub(r"::h[0-9a-f]{16}$", "", function)] += percent
    if not shares:
        print("  no samples")
        return
    cores = lambda kind: samples[kind] / args.freq / args.seconds
    print(f"  cores busy: {sum(cores(k) for k in samples):.2f} in what was sampled; " + ", ".join(
        f"{kind} {share:.1f} % ({cores(kind):.2f} cores)"
        for kind, share in sorted(shares.items(), key=lambda kv: -kv[1])))
    for kind, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        if share < 5:
            continue
        print(f"  {kind} ({share:.1f} % of the samples):")
        top = sorted(functions[kind].items(), key=lambda kv: -kv[1])[: args.top]
        for function, percent in top:
            print(f"    {percent:5.1f} %  {function[:110]}")


if __name__ == "__main__":
    main()
