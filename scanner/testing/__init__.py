"""Test fixtures that are real parts (servers, corpora), shared by the test suite and the benches."""
