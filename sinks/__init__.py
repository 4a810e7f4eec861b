"""Where gpufleet's records end up, and what acts on them.

- ClickHouse: how a process reaches it (``clickhouse_client``), the tables and their
  migrations (``clickhouse_ddl`` and the ``ddl_*`` modules), the writer (``write_clickhouse``)
  and the sink that feeds it from the topics (``consume_to_clickhouse``), the read path's rules
  (``read_path``) and its server for other processes (``query_server``), a server's users
  (``clickhouse_access``).
- People: the notifier (``consume_alerts``, ``route_alerts``, ``notify_owner``: webhooks and
  e-mail) and the owner's job report (``job_report``).
- The scheduler: the enforcer (``enforce_jobs``), which runs the actions the ladders let fall due.
"""
