"""Selection, the sixth stage: which stored kernel serves a shape, read from the store's
measurements. ``best`` is the one "best stored kernel" policy (the median ratio to the cuBLAS time
stored next to each time, per architecture), ``suite`` the benchmark suite (its shapes, which
kernel each entry measures, its summary), ``report`` the tables and the geometric mean that
scores use, and ``dispatch/`` the selection model that predicts a kernel's time at any shape and
the dispatcher it chooses for (``emit --dispatch``). It measures nothing itself.
"""
