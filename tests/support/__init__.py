"""What the tests share: builders of samples and traces, fakes at the pynvml boundary, the
processes and brokers the integration tests run, and small helpers. Tests import from here,
never from one another."""
