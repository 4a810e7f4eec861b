"""What the report commands read from ClickHouse and print: the fleet report (``fleet``, HTML
with charts), the goodput waterfall of a fleet, team or job (``goodput``), the ranked waste
(``opportunities``), and the workflows and a job's own view (``workflows``)."""
