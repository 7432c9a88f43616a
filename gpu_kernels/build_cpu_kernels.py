"""`python -m batchtop.gpu_kernels.build_cpu_kernels`: build batchtop's C++ CPU kernels now (right after
installing), so the first `batchtop` finds them ready. Prints where the library is; exit 0 when built.
(cpu_kernel_build is imported by the package itself, so running it with -m makes runpy warn.)"""

from __future__ import annotations

import sys

from batchtop.gpu_kernels.cpu_kernel_build import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
