"""The run-matrix driver and its memory guard (``commprof.sweeps``)."""
