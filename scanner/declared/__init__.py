"""What a model folder declares about its lineage (card front matter, mergekit config), read as untrusted data."""
