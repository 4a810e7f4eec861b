"""The serving engines on a host as the agent reads them: each engine's metric names
(``engines``: vLLM, SGLang, TGI, Triton) and the lines of its page a reading needs (``pick``),
their endpoints read in the agent's ticks (``scrape``, over HTTP by ``fetch``) or found where no
setting names them (``discover``); and a recorded fleet's series as the records an agent would
have sent (``recorded``: ``gpufleet replay``)."""
