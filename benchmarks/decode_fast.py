"""Decode cost per span, Python path vs the compiled fast path: `python -m benchmarks.decode_fast`.

Both decoders run in this one process over the same 512-span generator payloads
(``benchmarks.generator.template_payloads``), alternating, ``--repeats`` times; the median of
the per-repeat times is printed in microseconds per span, wall clock and CPU time of this process,
with the load average (the machine is shared: under load the wall clock mostly measures waiting
for a core, so compare runs minutes apart on the same box, and read the CPU time too). The Python path is
``decode_export_request(parse_protobuf(payload), limits)``; the fast path is
``collector.fastdecode.decode_fast(payload, limits)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.generator import template_payloads
from collector.decode import DecodeLimits, decode_export_request, parse_protobuf
from collector.fastdecode import AVAILABLE, decode_fast


def _time_per_span(decode, payloads: list[bytes], spans: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per span for one pass over the payloads."""
    wall, cpu = time.perf_counter(), time.process_time()
    for payload in payloads:
        decode(payload)
    return (time.perf_counter() - wall) / spans * 1e6, (time.process_time() - cpu) / spans * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=8192, help="spans per repeat (default 8192)")
    parser.add_argument("--repeats", type=int, default=7, help="repeats; the median is printed (default 7)")
    args = parser.parse_args(argv)
    if not AVAILABLE:
        print("collector._otlpfast is not built: run `python setup.py build_ext --inplace`")
        return 1
    limits = DecodeLimits()
    payloads = template_payloads(args.spans)
    if any(decode_fast(p, limits) is None for p in payloads):
        print("a generator payload fell back to the Python path; the comparison would be meaningless")
        return 1

    def python_path(payload: bytes):
        return decode_export_request(parse_protobuf(payload), limits)

    def fast_path(payload: bytes):
        return decode_fast(payload, limits)

    python_runs, fast_runs = [], []
    for _ in range(args.repeats):
        python_runs.append(_time_per_span(python_path, payloads, args.spans))
        fast_runs.append(_time_per_span(fast_path, payloads, args.spans))
    load = os.getloadavg()
    print(f"{args.spans} spans in {len(payloads)} requests, median of {args.repeats} repeats")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(f"{'':12} {'wall us/span':>13} {'(min)':>8} {'CPU us/span':>12} {'(min)':>8}")
    medians = {}
    for name, runs in (("python path", python_runs), ("fast path", fast_runs)):
        wall, cpu = [r[0] for r in runs], [r[1] for r in runs]
        medians[name] = (statistics.median(wall), statistics.median(cpu))
        print(f"{name:12} {medians[name][0]:13.2f} {min(wall):8.2f} {medians[name][1]:12.2f} {min(cpu):8.2f}")
    (py_wall, py_cpu), (fast_wall, fast_cpu) = medians["python path"], medians["fast path"]
    print(f"speed-up: {py_wall / fast_wall:.1f} x wall, {py_cpu / fast_cpu:.1f} x CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
