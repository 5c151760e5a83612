"""Code generation, the second stage: a validated point (gemmgen.describe.config.KernelConfig)
becomes one standalone CUDA source file. ``render`` fills the family's Jinja template (templates/)
with the point, its geometry and the data the templates need that Python computes (type names,
the harness's checks and tolerances), under StrictUndefined, and hashes templates and sources for
the store; ``trim`` then cuts the rendered file to its point's code. It reads only the describe
stage and the leaves; it never compiles or runs anything.
"""
