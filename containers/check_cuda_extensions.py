"""Fails unless torch-scatter and torch-sparse, as installed, carry CUDA kernels built for torch's CUDA.

    python containers/check_cuda_extensions.py

Needs no GPU: both packages load their ``_*_cuda`` extension modules whenever those exist (a CUDA
build also ships ``_*_cpu`` ones, which it loads only where no ``_cuda`` one exists), and each
registers ``torch.ops.<package>.cuda_version()``, the ``CUDA_VERSION`` of the toolkit the
extension was compiled with (``cuda.h``: 1000 * major + 10 * minor, 12010 for CUDA 12.1), or -1
for a CPU-only build (their ``csrc/version.cpp``). The check wants, for each package: every
``_*_cpu`` module matched by a ``_*_cuda`` one, and ``cuda_version()`` equal to the CUDA version
torch was built with (``torch.version.cuda``; 12.1 for torch 2.3.0 from PyPI). The packages' own
import check compares only the major version.

Used by containers/Dockerfile.cuda (the build fails on a CPU build, e.g. a wheel from a CPU
build's cache or a CPU wheelhouse) and by ``FORCE_CUDA=1 containers/make_wheelhouse.sh``.
Exit status 0 when both pass, 1 otherwise, with one line per problem on stderr.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

PACKAGES = ("torch_scatter", "torch_sparse")


def encoded(cuda: str) -> int:
    """``torch.version.cuda`` ("12.1") as ``cuda.h`` spells ``CUDA_VERSION`` (12010)."""
    major, minor = (int(part) for part in cuda.split(".")[:2])
    return 1000 * major + 10 * minor


def decoded(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def problems(package: str, torch_cuda: str | None, cuda_version: int, modules: list[str]) -> list[str]:
    """What is wrong with ``package``: its ``cuda_version()`` and the names of its extension modules."""
    found: list[str] = []
    if torch_cuda is None:
        return [f"{package}: torch is a CPU-only build (torch.version.cuda is None): nothing to check the CUDA kernels against"]
    expected = encoded(torch_cuda)
    if cuda_version == -1:
        found.append(
            f"{package}: compiled without CUDA kernels (cuda_version() = -1, a CPU build); "
            f"expected {expected} (CUDA {torch_cuda}, as torch)"
        )
    elif cuda_version != expected:
        found.append(
            f"{package}: compiled with CUDA {decoded(cuda_version)} (cuda_version() = {cuda_version}); "
            f"expected {expected} (CUDA {torch_cuda}, as torch)"
        )
    stems = {name.split(".")[0] for name in modules}
    cpu = sorted(stem for stem in stems if stem.endswith("_cpu"))
    if not cpu and not any(stem.endswith("_cuda") for stem in stems):
        found.append(f"{package}: no extension modules found")
    missing = [stem for stem in cpu if stem[: -len("_cpu")] + "_cuda" not in stems]
    if missing:
        found.append(f"{package}: no CUDA module beside {', '.join(missing)}")
    return found


def check(package: str) -> tuple[list[str], str]:
    import torch

    try:
        module = importlib.import_module(package)
    except Exception as error:  # the packages raise RuntimeError on a CUDA major mismatch
        return [f"{package}: import failed: {type(error).__name__}: {error}"], ""
    cuda_version = int(getattr(torch.ops, package).cuda_version())
    folder = pathlib.Path(str(module.__file__)).parent
    modules = sorted(path.name for path in folder.glob("_*.so"))
    found = problems(package, torch.version.cuda, cuda_version, modules)
    cuda_modules = sum(1 for name in modules if name.split(".")[0].endswith("_cuda"))
    return (
        found,
        f"{package} {getattr(module, '__version__', '?')}: cuda_version() = {cuda_version}, {cuda_modules} CUDA modules ({folder})",
    )


def main() -> int:
    import torch

    print(f"torch {torch.__version__}: CUDA {torch.version.cuda}", flush=True)
    failures: list[str] = []
    for package in PACKAGES:
        found, summary = check(package)
        if summary:
            print(summary, flush=True)
        failures += found
    for line in failures:
        print(f"check_cuda_extensions: {line}", file=sys.stderr)
    if not failures:
        print("check_cuda_extensions: OK, both carry CUDA kernels for torch's CUDA")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
