"""How every gpufleet component talks to Kafka: the client settings, security included, that
confluent-kafka and Faust share (``config``), and the creation of topics (``admin``). The wire
contract itself (records, schemas, topics) is ``schemas``'."""
