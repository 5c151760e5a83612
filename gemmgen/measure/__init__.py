"""Measuring, the fifth stage, on the GPU: a built point (or the cuBLAS baseline) is run, checked
and timed at a shape, and every outcome recorded in the store. The emitted launcher is called
through ctypes (``launcher``; it holds every launch rule), PyCUDA gives the device and its memory,
``verify`` and ``gpucheck`` judge C against float64 references by the describe stage's
tolerances, ``cublas`` and ``cublaslt`` are the baselines, ``l2flush`` empties L2 between timed
runs, and ``bench`` puts them together: build, verify, time, record. Importing any of it needs no
GPU; using the device does.
"""
