"""The collective model: links (published, fitted, cluster), NCCL's tuning search, the
nccl-tests readers and their calibration."""
