"""The local tools of the command line: a Kafka (KRaft) cluster run from the official jars for
the demo, the tests and a single machine (``kafka``: start, stop, nodes), its node
configuration (``kafka_node_config``), and a secure cluster's CA, certificates, users and ACLs
(``certificates``, ``kafka_security``)."""
