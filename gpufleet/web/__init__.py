"""The owners' service (``gpufleet serve``): who is asking (``identity``), what they may see
(``access``) and do (``actions``), the pages and their JSON twins (``app``, ``templates/``), the
figures they draw (``figures``) from ClickHouse (``data``, read without slowing the sink:
``reading``), and the command line's side of it for login nodes (``client``)."""
