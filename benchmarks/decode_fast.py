"""Decode cost per span, Python path vs the compiled fast path: `python -m benchmarks.decode_fast`.

Both decoders run in this one process over the same 512-span generator payloads
(``benchmarks.generator.template_payloads``), alternating, ``--repeats`` times; the median of
the per-repeat times is printed in microseconds per span, with the load average (the machine is
shared, so compare runs minutes apart on the same box). The Python path is
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


def _time_per_span(decode, payloads: list[bytes], spans: int) -> float:
    started = time.perf_counter()
    for payload in payloads:
        decode(payload)
    return (time.perf_counter() - started) / spans * 1e6


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

    python_us, fast_us = [], []
    for _ in range(args.repeats):
        python_us.append(_time_per_span(python_path, payloads, args.spans))
        fast_us.append(_time_per_span(fast_path, payloads, args.spans))
    py, fast = statistics.median(python_us), statistics.median(fast_us)
    load = os.getloadavg()
    print(f"{args.spans} spans in {len(payloads)} requests, median of {args.repeats} repeats")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(f"python path : {py:8.2f} us/span (min {min(python_us):.2f})")
    print(f"fast path   : {fast:8.2f} us/span (min {min(fast_us):.2f})")
    print(f"speed-up    : {py / fast:8.1f} x; fast path {1e6 / fast:,.0f} spans/s on one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
