"""Hydra's config groups; a package so that Hydra finds them in an installed wheel (pkg://dane.conf)."""
