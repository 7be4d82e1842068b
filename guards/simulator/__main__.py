"""``python -m guards.simulator regenerate sample_traces/`` rewrites the sample traces."""

from __future__ import annotations

import argparse
import logging
import sys

from guards.simulator.catalog import regenerate


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m guards.simulator", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    regen = commands.add_parser("regenerate", help="write every scenario's OTLP JSON and ground truth")
    regen.add_argument("out_dir", help="directory to write into, e.g. sample_traces/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "regenerate":
        written = regenerate(args.out_dir)
        logging.getLogger("guards.simulator").info("wrote %d files to %s", len(written), args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
