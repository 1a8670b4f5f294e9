"""commprof: where the communication time of data-parallel PyTorch training goes."""

__version__ = "0.1.0"
