"""`pip install driftscope` is the guards alone: only the OpenTelemetry API comes with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("driftscope", "collector", "analytics", "dashboard", "guards")


@pytest.fixture(scope="module")
def guards_only_venv(tmp_path_factory):
    """A fresh venv with `pip install <a copy of this checkout>` and nothing else."""
    root = tmp_path_factory.mktemp("guards-only")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return venv


@pytest.mark.slow
def test_guards_install_with_only_the_opentelemetry_api(guards_only_venv):
    python = guards_only_venv / "bin" / "python"
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.split()}
    heavy = {"duckdb", "torch", "streamlit", "pandas", "numpy", "opentelemetry-sdk", "pyarrow", "grpcio"}
    assert "driftscope" in installed and "opentelemetry-api" in installed
    assert not installed & heavy, installed & heavy
    code = (
        "from guards import VersionedStore, acting_as\n"
        "store = VersionedStore()\n"
        "with acting_as('planner', conversation_id='run-1'):\n"
        "    assert not store.write_state('plan', 'v1', expected_version=None)['rejected']\n"
        "print('ok')\n"
    )
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=guards_only_venv)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


@pytest.mark.slow
def test_server_commands_without_the_server_extra_say_what_to_install(guards_only_venv, tmp_path):
    run = subprocess.run(
        [str(guards_only_venv / "bin" / "driftscope"), "serve", "--db", str(tmp_path / "x.duckdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "pip install 'driftscope[server]'" in run.stderr
    assert "Traceback" not in run.stderr


# What each package may import (the architecture's table "Packages and what each may import").
MAY_IMPORT = {
    "collector": {"collector"},
    "analytics": {"analytics"},
    "dashboard": {"dashboard", "analytics"},
    "guards": {"guards"},
    "driftscope": set(PACKAGES),
}


def _import_graph() -> dict[str, set[str]]:
    """Our modules -> our modules they import anywhere in their code (function-level imports too)."""
    import ast

    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_modules_import_each_other_one_way_and_packages_only_downwards():
    graph = _import_graph()
    assert _cycles(graph) == []  # no loop, not even one hidden in a function-level import
    wrong = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if target.split(".")[0] not in MAY_IMPORT[module.split(".")[0]]
    ]
    assert wrong == []


def test_the_import_check_catches_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
