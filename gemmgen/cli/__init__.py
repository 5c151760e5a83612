"""The `gemmgen` command (also `python -m gemmgen`), the last stage: thin, it parses the command
line, calls the stages that do the work, and prints their results. ``main`` holds the parser,
its argument types and one function per command; a user's error is one line on stderr with exit
status 2. Nothing in gemmgen imports it.
"""
