"""Results: the files under ``data/`` — where they are, what produced them, how to read them."""
