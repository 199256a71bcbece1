"""The `sim` commands, one module per area; cli.py assembles them.

Every command has the same shape: typer options in, output paths checked before any work
(`output.py`), one call into `trainsim.api`, then rendering (a rich table, or one JSON object
with `--json`). Errors users can cause are `TrainsimError`s, which `cli.main` prints as one
line with exit code 2.
"""
