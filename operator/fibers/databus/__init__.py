"""The DatabusConsumer kind: change-data-capture consumers following the Databus 2.0 client design."""
