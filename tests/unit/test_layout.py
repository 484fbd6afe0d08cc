"""The layout rules `make lint` cannot see: every package is installed, the SDK library's import contract names
every module of it, and nothing imports the SDK by its folder's name."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def import_name(folder: Path) -> str:
    """The import name of a package folder, by pyproject's package-dir (sdk/cli -> popgate.cli)."""
    relative = folder.relative_to(ROOT).as_posix()
    for name, source in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        if relative == source or relative.startswith(source + "/"):
            return name + relative[len(source) :].replace("/", ".")
    return relative.replace("/", ".")


def package_folders() -> list[Path]:
    """The source's package folders; what a build left in the checkout (`pip install ./sdk`: sdk/build/) is not."""
    tops = ["broker", "proxy", "sdk", "spark_metrics", "proto"]
    found = [p.relative_to(ROOT) for top in tops for p in (ROOT / top).rglob("__init__.py")]
    return [
        ROOT / p.parent
        for p in found
        if not {"__pycache__", "build"} & set(p.parts) and not any(part.endswith(".egg-info") for part in p.parts)
    ]


def test_every_package_folder_is_installed() -> None:
    assert sorted(import_name(folder) for folder in package_folders()) == sorted(
        PYPROJECT["tool"]["setuptools"]["packages"]
    )


def test_the_sdk_library_contract_names_every_module_of_the_library() -> None:
    (contract,) = [c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if "SDK library" in c["name"]]
    library = {
        import_name(path.parent) if path.name == "__init__.py" else f"{import_name(path.parent)}.{path.stem}"
        for path in (ROOT / "sdk").glob("*.py")
    }
    assert set(contract["source_modules"]) == library


def test_nothing_imports_the_sdk_by_its_folder_name() -> None:
    """The folder is sdk/, the package `popgate`: `import sdk` would load a second copy of every class."""
    offenders = []
    for top in ("broker", "proxy", "sdk", "spark_metrics", "proto", "tests", "bench", "deploy"):
        for path in (ROOT / top).rglob("*.py"):
            if "popgate_pb" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                if any(n == "sdk" or n.startswith("sdk.") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
