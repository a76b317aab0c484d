"""Build the typed-Cython prototype of docs/compiled-core.md in a scratch copy of this
checkout, to measure it; the package itself is never compiled.

Copies the checkout's files (tracked and untracked, not ignored) to OUT, lays the
augmenting ``.pxd`` files of ``benchmarks/compiled_core/simulator/`` next to the ``.py``
files they declare, and compiles the twelve hot modules in place with Cython 3 (not a
dependency: install it in its own environment, e.g. ``python -m venv
--system-site-packages /tmp/cy && /tmp/cy/bin/pip install cython``). Then measure from OUT,
as docs/compiled-core.md does:

    python benchmarks/compiled_core/build.py /tmp/compiled --cythonize /tmp/cy/bin/cythonize
    cd /tmp/compiled && python benchmarks/bench_vidur.py --repeat 3 --phases --profile none

``--untyped`` compiles the same modules without the declarations (the 5% baseline).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

#: Compiled as they are (with their .pxd where one exists).
MODULES = ["simulator/engine/request.py", "simulator/engine/kvcache.py",
           "simulator/engine/preemption.py", "simulator/engine/batching.py",
           "simulator/engine/decoderun.py", "simulator/engine/fastpath.py",
           "simulator/engine/stepping.py", "simulator/engine/replica.py",
           "simulator/metrics/gaps.py", "simulator/metrics/records.py",
           "simulator/cluster/simulation.py"]
#: Compiled with C ``pow()`` for ``**``: Cython multiplies out integer exponents otherwise,
#: 1 ulp away from CPython's ``pow()`` in ``StageCost._pnorm`` (docs/compiled-core.md).
POW_MODULES = ["simulator/model/cost.py"]


def build(out: Path, cythonize: str, typed: bool = True) -> None:
    """Copy the checkout to ``out`` and compile the hot modules there in place."""
    if out.exists():
        shutil.rmtree(out)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, files):  # the checkout's files, as git sees them
        if (ROOT / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, out / name)
    if typed:
        for pxd in (HERE / "simulator").rglob("*.pxd"):
            shutil.copy(pxd, out / pxd.relative_to(HERE))
    base = [cythonize, "-i", "-3", "-X", "annotation_typing=False"]
    subprocess.run([*base, *MODULES], cwd=out, check=True)
    subprocess.run([*base, "-X", "cpow=True", *POW_MODULES], cwd=out, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="scratch folder (replaced)")
    ap.add_argument("--cythonize", default="cythonize", help="Cython 3's cythonize")
    ap.add_argument("--untyped", action="store_true", help="without the .pxd declarations")
    a = ap.parse_args()
    build(a.out, a.cythonize, typed=not a.untyped)
    print(f"built in {a.out}; measure there: cd {a.out} && python "
          "benchmarks/bench_vidur.py --repeat 3 --phases --profile none")


if __name__ == "__main__":
    main()
