"""actors."""
