"""The GPUs as the agent reads them: NVML (``sample_nvml``, the one place pynvml is called),
one ``reading`` per GPU a tick, the processes on them attributed to workflows
(``attribute_process``) and a GPU's time shared among its holders (``shares``)."""
