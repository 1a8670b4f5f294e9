"""Ray actors: rank actors, gangs of them, and one cell's execution (``commprof.actors``)."""
