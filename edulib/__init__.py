"""edulib: distributed deep-learning training, taught by running it: every algorithm is data."""

__version__ = "0.1.0"
