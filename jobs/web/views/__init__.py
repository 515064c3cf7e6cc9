"""One module per page, each a Flask blueprint named after its page (as datasette's views): home, discrepancies,
search, model, pair, family, sql, tables."""
