"""Run the decoder fuzz tests against an AddressSanitizer + UBSan build of collector/_otlpfast.c.

``make fuzz-sanitize`` (or ``python -m tests.fuzz_sanitize [pytest args]``): compiles the decoder
with ``gcc -fsanitize=address,undefined -fno-sanitize-recover=undefined`` into a temporary copy
of the collector package (the checkout's own build is left alone), then runs
``TESTS`` (the decoder's differential and fuzz tests, the batch mapping's and the Arrow columns')
there with the ASan runtime preloaded into Python. Any sanitizer report aborts the run with a non-zero exit.
``DRIFTSCOPE_FUZZ_SCALE`` (default 1, the full count; `make test` runs 0.2 unsanitized) scales the examples.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = (
    "tests/collector/test_fastdecode_differential.py",
    "tests/collector/test_decode_fuzz.py",
    "tests/collector/test_mapping_plans.py",  # the mapping's compiled loops (group_rows, copy_columns)
    "tests/collector/test_arrow_columns.py",  # utf8_column
)


def _runtime(name: str) -> str:
    return subprocess.run(
        ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str]) -> int:
    if shutil.which("gcc") is None:
        print("fuzz-sanitize needs gcc (with libasan and libubsan)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="driftscope-sanitize-") as tmp:
        work = Path(tmp)
        shutil.copytree(
            REPO / "collector", work / "collector", ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
        shutil.copytree(REPO / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "pyproject.toml", work / "pyproject.toml")  # pytest's markers and options
        # Every other top-level package and data directory, as the checkout has them (a fixed list
        # went stale when a test began importing corpus.dump).
        for path in sorted(REPO.iterdir()):
            if path.is_dir() and not path.name.startswith((".", "_")) and not (work / path.name).exists():
                (work / path.name).symlink_to(path)
        target = work / "collector" / ("_otlpfast" + sysconfig.get_config_var("EXT_SUFFIX"))
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
             f"-I{sysconfig.get_paths()['include']}", str(REPO / "collector" / "_otlpfast.c"), "-o", str(target)],
            check=True,
        )  # fmt: skip
        env = {
            **os.environ,
            "LD_PRELOAD": f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
            "PYTHONPATH": str(work),
            "DRIFTSCOPE_FUZZ_SCALE": os.environ.get("DRIFTSCOPE_FUZZ_SCALE", "1"),
            "HF_HUB_OFFLINE": "1",
        }
        check = (
            "import collector._otlpfast as m, sys; sys.exit(0 if m.__file__.startswith(sys.argv[1]) else 1)"
        )
        if subprocess.run([sys.executable, "-c", check, tmp], cwd=work, env=env).returncode != 0:
            print("the sanitized build was not the one imported", file=sys.stderr)
            return 1
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *argv]
        return subprocess.run(command, cwd=work, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
