"""Kineto/chrome traces read, classified and measured: torch-free and Ray-free (Ray only through
``commprof.extras`` for ``analyze --ray``), so ``commprof analyze`` runs on the light install."""
