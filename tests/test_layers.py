"""The one-way layering (jobs > lineage_graph > scanner, scanner's stages in pipeline order, no import cycles inside
a package), as the import-linter contracts in pyproject.toml state it. Imports inside functions count as much as
top-level ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("scanner", "lineage_graph", "jobs")
LINT_IMPORTS = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
                "--no-cache", "--config", "pyproject.toml"]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the packages under ``root`` (and nothing installed elsewhere), with the repo's contracts."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(LINT_IMPORTS, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_imports_follow_the_layers() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_catch_a_lazy_import_against_the_arrows_and_a_cycle(tmp_path: Path) -> None:
    """A copy of the packages with three bad imports hidden inside functions: the linter must see each."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "scanner" / "errors.py").open("a") as f:
        f.write("\n\ndef _upwards() -> None:\n    from jobs.cli import app  # noqa: F401\n")
    with (tmp_path / "jobs" / "cli" / "refusals.py").open("a") as f:
        f.write("\n\ndef _around() -> None:\n    from jobs.cli import app  # noqa: F401\n")
    with (tmp_path / "scanner" / "reading" / "checkpoint.py").open("a") as f:
        f.write("\n\ndef _ahead() -> None:\n    from scanner.fingerprints import inputs  # noqa: F401\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "jobs > lineage_graph > scanner BROKEN" in result.stdout
    assert "scanner, the core library, imports neither jobs nor lineage_graph BROKEN" in result.stdout
    assert "no import cycles between the modules of a package BROKEN" in result.stdout
    assert "scanner's stages import only downwards BROKEN" in result.stdout
    assert "scanner.errors -> jobs.cli" in result.stdout
    assert "scanner.reading.checkpoint -> scanner.fingerprints.inputs" in result.stdout
