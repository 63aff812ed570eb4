"""The benchmarks (`python -m scripts.bench SECTION`) and the helper scripts of a checkout."""
