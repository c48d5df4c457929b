"""The Connect kind: one Kafka Connect connector per resource."""
