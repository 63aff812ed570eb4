"""One script per paper figure or table, each drawing from results/ only; `make_all` rebuilds them all.

A figure trains nothing, so its ``--help`` imports no torch: what imports it (the algorithm classes behind a label,
`dane.data`, `dane.run_config`) is imported inside the function that needs it (tests/test_import_graph.py runs every
figure's ``--help``)."""
