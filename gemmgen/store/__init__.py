"""The store, the fourth stage: the results database, where every measurement (failures included)
and every Optuna study lives. ``db`` is its schema and queries (SQLAlchemy 2: kernels, devices,
problems, results), ``engine`` the SQLite (WAL, BEGIN IMMEDIATE) and PostgreSQL set-up shared by
everything that opens the database, ``studies`` the Optuna storage on the same URL, safe for many
tuners at once. It knows what a row holds, not how it was measured or which row is best.
"""
