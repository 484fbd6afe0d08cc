"""Generate the Python code for proto/*.proto into proto/popgate_pb/.

The sources are mapped to the virtual import path ``popgate_pb/`` so the
generated modules import each other as ``popgate_pb.*`` (an import name no
well-known distribution uses). ``--check`` regenerates into a temporary
directory and exits 1 when the committed code differs.
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PACKAGE = "popgate_pb"


def sources() -> list[Path]:
    return sorted(p for p in PROTO_DIR.rglob("*.proto") if PACKAGE not in p.parts)


def generate(out_dir: Path) -> None:
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PACKAGE}={PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in sources()],
    ]
    subprocess.run(cmd, check=True)
    for directory in [out_dir / PACKAGE, *(p for p in (out_dir / PACKAGE).rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    (out_dir / PACKAGE / "py.typed").touch()  # PEP 561: the stubs are read by users' type checkers


def tree(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _same(a: Path, b: Path) -> bool:
    return filecmp.cmp(a, b, shallow=False)


def main(argv: list[str]) -> int:
    target = PROTO_DIR / PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = tree(Path(tmp) / PACKAGE)
        if "--check" in argv:
            current = tree(target) if target.exists() else {}
            stale = sorted(
                name
                for name in fresh.keys() | current.keys()
                if name not in fresh or name not in current or not _same(fresh[name], current[name])
            )
            if stale:
                print("generated code is stale; run `make proto`:", *stale, sep="\n  ")
                return 1
            return 0
        # Update in place (leaving __pycache__ alone): copy what changed, delete what is no longer generated.
        current = tree(target) if target.exists() else {}
        for name in current.keys() - fresh.keys():
            current[name].unlink()
        for name, path in fresh.items():
            if name not in current or not _same(path, current[name]):
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
