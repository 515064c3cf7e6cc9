"""hubtrace scanner: checkpoint access, canonical inputs, activations and the independence statistics."""

__version__ = "0.1.0"
