"""The window stage: GPU samples into per-workflow event-time windows, their efficiency and
goodput, the job-to-date summaries and the right-size a job should ask for next time."""
