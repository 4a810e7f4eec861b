"""The serving engines on a host as the agent reads them: each engine's metric names
(``engines``: vLLM, SGLang, TGI, Triton), their endpoints read on threads of their own
(``scrape``) or found where no setting names them (``discover``); and a recorded fleet's series
as the records an agent would have sent (``recorded``: ``gpufleet replay``)."""
