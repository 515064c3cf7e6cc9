"""Testing a pair of models: from two fingerprints or two checkpoints, the statistics' results, the block map and
localisation of a related pair, and the pair worker that runs these tests for a scan."""
