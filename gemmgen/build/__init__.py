"""Building, the third stage, on the CPU: ``nvcc`` turns an emitted file into a shared library
(its C launcher, which the measure stage calls through ctypes) and the kernel's cubin, reads
ptxas's resource report (registers, stack, spills), finds the CUDA tools, checks that the
installed nvcc can build a target, and keeps every build in an on-disk cache keyed by source,
target, flags and nvcc version. A compile error is a result, not an exception. It reads the
describe and codegen stages only.
"""
