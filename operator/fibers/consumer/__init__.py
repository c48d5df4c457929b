"""What runs in a DatabusConsumer's pods (`fibers consume`): the Databus 2.0 client, in Python.

The operator side (`fibers.databus`) never imports it; both share only the consumer's configuration,
its checkpoint format and its ownership labels, which live there. Callbacks code against
`fibers.consumer.api` only.
"""
