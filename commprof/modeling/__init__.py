"""The models, torch-free: ``collective`` (links and the collective model), ``step`` (the step
model, its calibration, corrections and the cap advice), ``trace_whatif`` (a trace's steps
replayed, then what-ifs), ``buckets`` (DDP's bucket rule) and ``memory`` (the memory guard)."""
