"""Describing a point, the first stage: everything said about a kernel before any source exists.
The vocabulary of a problem (``dtypes``: every fact about each precision; ``problem``: shapes and
the variant -- layouts, C's type, bias, activation, batch -- with their choices and names;
``tolerance``: how far a correct C may be from a float64 reference, and the checks that judge it),
the target architectures (``arch``), the kernel families (``families/``: parameters, geometry,
own constraints), the rules common to all of them (``constraints``), a validated point and its
canonical name (``config``), the named points (``points``) and workload files (``workload``). It
imports nothing of gemmgen but the leaves (``errors``, ``paths``): every later stage reads it.
"""
