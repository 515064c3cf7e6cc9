"""`hubtrace serve`: a read-only local web app on a scan database, for people who read evidence rather than write
SQL (docs/serve.md). `app.create_app` builds it; one module per page under `views/`; every query is the store's
(scanner.store.queries); hub text is escaped and made visible in every template (`text`)."""
