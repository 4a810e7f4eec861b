"""The kubelet's pod resources API v1 (``api.proto``) and the modules ``make proto`` makes of it."""
