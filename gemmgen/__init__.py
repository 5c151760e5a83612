"""gemmgen: a code-generating CUDA GEMM kernel compiler and autotuner.

One package per stage a kernel goes through, each importing only from those before it:
describe -> codegen -> build -> store -> measure -> selection -> (tune | torch | plot) -> cli,
with errors and paths as leaves everything may import (docs/design.md, "The stages").
"""

__version__ = "0.1.0"
