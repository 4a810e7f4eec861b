"""The windows: GPU samples into per-workflow event-time windows, their efficiency and
goodput, the job-to-date summaries and the right-size a job should ask for next time (plain
logic; the stage that feeds it is ``streams.stages.windows``)."""
