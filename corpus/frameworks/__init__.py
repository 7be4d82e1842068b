"""One generator module per framework; each exposes ``generate(out_dir) -> Path`` (its truth file)."""
