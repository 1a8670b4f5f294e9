"""The LaTeX report templates, read with importlib.resources."""
