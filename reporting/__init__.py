"""Figures, LaTeX tables and the PDF reports (``commprof.reporting``)."""
