"""Link prediction in the trainer (``megabatch train --task link``, issue 31): the in-memory path.

``ranking`` scores held-out edges (numpy only); ``options`` the command-line flags (no torch);
``inmemory`` the batches, from the loader's link sampler over the prepared graph held in RAM;
``model`` the encoder and decoder; ``records`` what a run is configured with and records;
``loop`` the training loop; ``run`` the command's link path. Nothing here is imported by a node run,
except ``options`` (the flags) and ``ranking``'s metric names, which ``trainer.cli`` and the
checkpoint reader need.
"""
