"""The trace what-if: a real trace's steps replayed, then another link, world size or bucket cap."""
