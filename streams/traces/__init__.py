"""Trace analysis: profiler traces' kernel events, one session per rank's trace, the analysers
(each an HTA analysis or one of gpufleet's own) and the findings they lead to (plain logic;
the stage is ``streams.stages.traces``)."""
