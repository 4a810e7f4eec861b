"""The simulated fleet of the demo and the tests: training workflows (``fleet``), a serving
deployment (``serving``), and a run of both through the pipeline (``run``)."""
