"""gemmgen: a code-generating CUDA GEMM kernel compiler and autotuner."""

__version__ = "0.1.0"
