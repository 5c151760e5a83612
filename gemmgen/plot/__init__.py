"""`gemmgen plot`: pictures of a results database (extra 'plot': matplotlib).

Each kind has a module that reads the database into plain data (no matplotlib needed, so the
numbers are testable alone) and a drawing function in ``draw``:

- ``history``    (history.py): one Optuna study's trials, TFLOP/s in the order they finished, the
  best so far, the cuBLAS TFLOP/s its tune measured, and its failed trials;
- ``suite``      (suite.py): the stored suite run (tag ``suite``) as a shape x precision grid of
  ratios to cuBLAS, by gemmgen.selection.best's policy;
- ``ladder``     (ladder.py): the named points v1..v6 and cuBLAS, TFLOP/s per shape;
- ``importance`` (importance.py): Optuna's parameter importances of one study (PED-ANOVA).

``command`` is the subcommand (arguments, checks, writing the file); ``figure`` loads matplotlib
and saves PNG or SVG; ``studies`` reads the Optuna studies of a results database without changing
it; ``target`` picks the architecture whose kernels a picture shows. docs/plots.md shows each
picture's command.
"""
