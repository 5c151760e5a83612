"""`gemmgen emit --dispatch`: one standalone CUDA file holding the kernels stored as best for a
set of shapes, and one launcher that picks among them by (M, N, K).

select.py decides which kernels and which shape gets which (from the results database, by
gemmgen.best's policy); emit.py writes the file (templates/dispatch.cu.j2). The rule for shapes
that were not tuned lives in the emitted C++ only (gg_dispatch_choose); callers ask the library
(<launcher>_choice) rather than computing it again.
"""
