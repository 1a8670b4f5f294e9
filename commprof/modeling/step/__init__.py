"""The step model: DDP buckets on a link played on a step timeline, its calibration on a
dataset, its corrections and the cap advice."""
