"""Reading a model: its files checked, its weights in canonical roles whatever the format or architecture, and its
MLPs' activations on given inputs from its own forward pass. Nothing here knows of fingerprints, pairs or the store."""
