"""One script per paper figure or table, each drawing from results/ only; `make_all` rebuilds them all."""
