"""The Faust side of the worker's stages: a module per stage whose ``register`` adds its agents,
timers and tables to the app, reads its topics, calls the stage's plain logic (``windows``
calls ``window_step``, which calls ``streams.windows``, ``streams.alerts``,
``streams.enforcement`` and ``streams.profiling``) and sends what it returns; ``io`` and
``state`` are what every stage does alike with Kafka and its state (records durable before
the state that led to them)."""
